# %% [markdown]
# # Reflexion: three roles, one session, one worker
#
# Reflexion repeats a task until it passes: an **actor** attempts it, an
# **evaluator** judges the attempt, and on failure a **self-reflection** step
# writes advice that the next trial's actor reads. The three roles have
# different system prompts, but they belong to one run, so they share one
# session id: every call is pinned to the same worker, and from the second
# trial on each role's prompt starts with what that worker already cached.
#
# **The workers here are simulated** (`agent_cache.sim.SimFleet`: a real
# radix cache over tokens, deterministic made-up answers; not SGLang, no GPU
# needed). To run against real SGLang workers, drop the fleet and pass their
# URLs: `ChatSGLang(model="qwen", workers=["http://gpu-1:30000", "http://gpu-2:30000"])`,
# and remove the scripted `sim_output` verdicts (SGLang ignores that field;
# parse the evaluator's own answer instead).

# %%
import json

from langchain_core.messages import HumanMessage, SystemMessage

from agent_cache import ChatSGLang
from agent_cache.sim import SimFleet

fleet = SimFleet(2, time_scale=0.0).start()
names = {url: f"worker-{i}" for i, url in enumerate(fleet.urls)}
llm = ChatSGLang(model="qwen", workers=fleet.urls)

# One session id for the whole run: all three roles land on one worker.
run = llm.bind(session_id="reflexion-run-1")

# %% [markdown]
# ## The three roles
#
# Each role keeps its own stable prompt prefix (system prompt, then the
# task, then the reflections so far, which only ever grow at the end), so a
# role's prompt in trial N starts with its prompt from trial N-1.

# %%
TASK = "Write a Python function is_palindrome(s) that ignores case, spaces and punctuation."
ACTOR = "You are an expert Python programmer. Solve the task. Follow the advice from earlier reflections."
EVALUATOR = "You are a strict code reviewer. Reply PASS or FAIL, then one sentence explaining why."
REFLECTOR = "You analyse a failed attempt and write one sentence of advice for the next attempt."

# The simulator cannot judge code, so the evaluator's verdicts are scripted
# (fail, fail, pass) to make the loop deterministic.
VERDICTS = [
    "FAIL: it does not ignore punctuation.",
    "FAIL: it crashes on an empty string.",
    "PASS: it handles case, punctuation and the empty string.",
]


def context(reflections: list[str]) -> str:
    notes = "\n".join(f"- {r}" for r in reflections) or "- none yet"
    return f"Task: {TASK}\n\nReflections from earlier trials:\n{notes}"


def actor(reflections):
    return run.invoke([SystemMessage(ACTOR), HumanMessage(context(reflections))])


def evaluator(reflections, attempt, trial):
    prompt = f"{context(reflections)}\n\nAttempt:\n{attempt}"
    return run.invoke([SystemMessage(EVALUATOR), HumanMessage(prompt)],
                      extra_body={"sim_output": VERDICTS[trial]})


def reflect(reflections, attempt, verdict):
    prompt = f"{context(reflections)}\n\nAttempt:\n{attempt}\n\nVerdict: {verdict}"
    return run.invoke([SystemMessage(REFLECTOR), HumanMessage(prompt)])

# %% [markdown]
# ## The loop

# %%
reflections: list[str] = []
calls = []  # (trial, role, AIMessage)
for trial in range(3):
    attempt = actor(reflections)
    verdict = evaluator(reflections, attempt.content, trial)
    calls += [(trial + 1, "actor", attempt), (trial + 1, "evaluator", verdict)]
    print(f"trial {trial + 1}: {verdict.content}")
    if verdict.content.startswith("PASS"):
        break
    reflection = reflect(reflections, attempt.content, verdict.content)
    calls.append((trial + 1, "reflection", reflection))
    reflections.append(reflection.content)

# %% [markdown]
# ## Every call, and the hit rate per trial
#
# Trial 1 fills the cache; later trials find each role's prefix there.

# %%
print(f"{'trial':>5}  {'role':10}  {'worker':8}  {'routing':18}  {'input':>5}  {'cache_read':>10}")
for trial, role, msg in calls:
    usage = msg.usage_metadata
    print(f"{trial:>5}  {role:10}  {names[msg.response_metadata['worker']]:8}  "
          f"{msg.response_metadata['routing']:18}  {usage['input_tokens']:>5}  "
          f"{usage['input_token_details']['cache_read']:>10}")

hit_rates = []
for trial in sorted({t for t, _, _ in calls}):
    msgs = [m for t, _, m in calls if t == trial]
    read = sum(m.usage_metadata["input_token_details"]["cache_read"] for m in msgs)
    total = sum(m.usage_metadata["input_tokens"] for m in msgs)
    hit_rates.append(round(read / total, 3))
    print(f"trial {trial}: hit rate {read / total:.0%}")

# %%
import matplotlib

matplotlib.use("Agg")  # script only: draw off-screen (the notebook shows the plot inline)
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(5, 3))
ax.bar([f"trial {i + 1}" for i in range(len(hit_rates))], hit_rates, color="tab:green")
ax.set_ylim(0, 1)
ax.set_ylabel("prompt tokens from cache")
ax.set_title("Reflexion: cache hit rate per trial")
fig.tight_layout()
fig.savefig("reflexion_cache.png")

# %% [markdown]
# ## Summary (checked by the project's tests)

# %%
summary = {
    "trials": len(hit_rates),
    "verdicts": [m.content.split(":")[0] for _, role, m in calls if role == "evaluator"],
    "calls": len(calls),
    "sessions": sorted({m.response_metadata["session_id"] for _, _, m in calls}),
    "workers": sorted({names[m.response_metadata["worker"]] for _, _, m in calls}),
    "routing": [m.response_metadata["routing"] for _, _, m in calls],
    "hit_rate_per_trial": hit_rates,
}
print("SUMMARY " + json.dumps(summary))
llm.close()
fleet.stop()
