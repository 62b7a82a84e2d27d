# %% [markdown]
# # Routing sessions over a fleet
#
# Three things `ChatSGLang` does when it has several workers:
#
# 1. it spreads new sessions over the workers, and pins each one to its worker;
# 2. when a worker dies mid-session, the session moves to a healthy worker
#    (routing outcome `moved:unhealthy`) and carries on there;
# 3. with `templates="templatize"`, volatile values in the system prompt (a
#    timestamp, the user's name) are moved out of the shared prefix, so
#    *different* sessions hit the cache for the common part of the prompt.
#
# **The workers here are simulated** (`agent_cache.sim.SimFleet`: a real
# radix cache over tokens, deterministic made-up answers; not SGLang, no GPU
# needed). To run against real SGLang workers, drop the fleet and pass their
# URLs: `ChatSGLang(model="qwen", workers=["http://gpu-1:30000", "http://gpu-2:30000", ...])`
# (start SGLang with `--enable-cache-report` so it reports cached tokens).

# %%
import json
from collections import Counter

from langchain_core.messages import HumanMessage, SystemMessage

from agent_cache import ChatSGLang
from agent_cache.routing import Router
from agent_cache.sim import SimFleet

fleet = SimFleet(3, time_scale=0.0).start()
names = {url: f"worker-{i}" for i, url in enumerate(fleet.urls)}
llm = ChatSGLang(model="qwen", workers=fleet.urls)


def chat(model, history, text, **kwargs):
    """One turn: add the user's text, call the model, keep its reply in the history."""
    history.append(HumanMessage(text))
    reply = model.invoke(history, **kwargs)
    history.append(reply)
    return reply


def show(session, reply):
    meta, usage = reply.response_metadata, reply.usage_metadata
    print(f"{session:12}  {names[meta['worker']]:8}  {meta['routing']:18}  "
          f"input {usage['input_tokens']:>4}  cache_read {usage['input_token_details']['cache_read']:>4}")

# %% [markdown]
# ## 1. Sessions spread over the workers
#
# Six support sessions, each for a different product (so a different system
# prompt), two turns each. The first call places a session; the second is
# `pinned` to the same worker.

# %%
PRODUCTS = ["billing", "shipping", "returns", "accounts", "warranty", "gift cards"]
histories = {}
placed = {}
for product in PRODUCTS:
    session = f"s-{product.replace(' ', '-')}"
    histories[session] = [SystemMessage(f"You are the {product} support assistant of an online shop.")]
    for text in ["Hello, I have a question.", "Can you explain that in more detail?"]:
        reply = chat(llm, histories[session], text, session_id=session)
        show(session, reply)
    placed[session] = names[reply.response_metadata["worker"]]

print(Counter(placed.values()))

# %% [markdown]
# ## 2. A worker dies mid-session
#
# Stop the worker of the first session. Its next call fails to connect, the
# worker is marked unhealthy, and the retry re-pins the session on another
# worker (`moved:unhealthy`). That worker has to prefill the history once;
# the call after that is `pinned` again and hits the new worker's cache.

# %%
victim = "s-billing"
dead = placed[victim]
fleet.stop_worker(int(dead.split("-")[1]))
print(f"stopped {dead}, which served {victim}")

moved = [chat(llm, histories[victim], text, session_id=victim)
         for text in ["Are you still there?", "Great, let's continue."]]
for reply in moved:
    show(victim, reply)

# %% [markdown]
# ## 3. Templates: on vs off
#
# Real agent prompts often start with a clock and the user's name, which
# makes every session's prefix unique. Four users, four timestamps, the same
# long instructions. Each variant gets a fresh fleet so neither sees the
# other's cache; we look at the *first* call of each session, which can only
# hit the cache if another session left the shared part there. With
# templates, the second user joins the first on the worker that holds the
# instructions and reads them from the cache; the third would take that
# worker past a fair share of the fleet's sessions (1.25 x the mean), which
# costs more than one prefill of the instructions, so it starts on an idle
# worker; the fourth reuses the template there. Without templates no two
# prompts share the instructions, so the sessions just spread out.

# %%
RULES = "".join(f"Rule {i}: be polite, be precise and cite the order number when you can.\n" for i in range(20))
USERS = [("Alice", "2026-12-02 14:03:07"), ("Bob", "2026-12-02 14:05:41"),
         ("Chen", "2026-12-02 14:09:12"), ("Dana", "2026-12-02 14:12:58")]


def first_calls(templates):
    with SimFleet(3, time_scale=0.0) as fresh:
        # One router shared by the per-user models, so each sees where the others' templates live.
        router = Router(fresh.urls)
        rows = []
        for user, clock in USERS:
            # The timestamp is detected by itself; the user's name is declared as a variable,
            # so with "templatize" both move out of the shared prefix.
            model = ChatSGLang(model="qwen", workers=fresh.urls, router=router,
                               templates=templates, template_variables={"user_name": user})
            system = SystemMessage(f"Current time: {clock}. You are helping {user}.\n{RULES}")
            reply = model.invoke([system, HumanMessage("Where is my order?")], session_id=f"{templates}-{user}")
            model.close()
            rows.append({
                "user": user,
                "worker": fresh.urls.index(reply.response_metadata["worker"]),
                "routing": reply.response_metadata["routing"],
                "template_id": reply.response_metadata["template_id"],
                "input": reply.usage_metadata["input_tokens"],
                "cache_read": reply.usage_metadata["input_token_details"]["cache_read"],
            })
        router.close()
    return rows


templated = {}
for mode in ["off", "templatize"]:
    templated[mode] = first_calls(mode)
    print(f"templates={mode!r}")
    for row in templated[mode]:
        print(f"  {row['user']:6} worker-{row['worker']}  {row['routing']:18} template {row['template_id']}  "
              f"input {row['input']:>4}  cache_read {row['cache_read']:>4}")

# %%
import matplotlib

matplotlib.use("Agg")  # script only: draw off-screen (the notebook shows the plot inline)
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(6, 3))
width = 0.4
for k, mode in enumerate(["off", "templatize"]):
    xs = [i + (k - 0.5) * width for i in range(len(USERS))]
    ax.bar(xs, [r["cache_read"] for r in templated[mode]], width, label=f"templates={mode!r}")
ax.set_xticks(range(len(USERS)), [u for u, _ in USERS])
ax.set_ylabel("cache_read, first call")
ax.set_title("Cross-session cache hits")
ax.margins(y=0.35)  # headroom for the legend
ax.legend(loc="upper left")
fig.tight_layout()
fig.savefig("multi_worker_routing.png")

# %% [markdown]
# ## Summary (checked by the project's tests)

# %%
summary = {
    "sessions": placed,
    "workers_used": len(set(placed.values())),
    "stopped": dead,
    "moved": {
        "routing": [r.response_metadata["routing"] for r in moved],
        "workers": [names[r.response_metadata["worker"]] for r in moved],
        "cache_read": [r.usage_metadata["input_token_details"]["cache_read"] for r in moved],
    },
    "templates": {
        mode: {
            "template_ids": len({r["template_id"] for r in rows}),
            "workers": len({r["worker"] for r in rows}),
            "cross_session_cache_read": sum(r["cache_read"] for r in rows[1:]),
        }
        for mode, rows in templated.items()
    },
}
print("SUMMARY " + json.dumps(summary))
llm.close()
fleet.stop()
