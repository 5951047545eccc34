"""Live mode: the simulator against reality.

`bench/replay_live.py TRACE --format F --gpus N --url URL` submits the trace's jobs to a
running clockq as `synthetic` jobs, time-compressed, reads each job's history back, and compares
it with the simulator's replay (clockq's policy) of the same jobs on the same number of GPUs:
start order, mean wait, GPU utilisation, and each job's first start side by side.

What runs live, and in the simulator (`plan.convert`):

- **One GPU each.** The live system runs single-GPU jobs only: a multi-GPU (gang) job runs as a
  single-GPU job with the same duration. The simulator is given this same converted trace, so
  both sides see the same jobs; the comparison is of the scheduling, not of the gang model.
- **Compression.** `compress` divides arrivals and durations alike (trace seconds -> live
  seconds): x25 turns a 20-minute trace window into under a minute of arrivals. Arrivals are
  shifted so that the first job is submitted at 0.
- **Durations become steps**: steps = max(1, round(duration_s * 1000 / step_ms)) with a fixed
  step_ms (20 ms by default), and the simulator is given steps * step_ms as the duration, so both
  do the same work.
- **State.** state_kb = the job's checkpoint_mb in KB, capped at `state_kb_cap` (1024 KB by
  default): a compressed replay cannot afford GB checkpoints at every switch, so switches are
  cheaper than the trace's jobs would make them. The simulator prices switches for the capped
  size too.
- **Utilisation.** The synthetic job's gpu_util is the trace's avg_util where it has one, else
  0.9 (the workload's default); the simulator plans slices from the same figure.
- **No deadlines.** Deadlines are dropped on both sides: a compressed deadline of a few seconds
  would test the SLO check's 10 s tick rather than the schedule. Tier start timeouts (RT: 1 s)
  still apply on both sides.
- **Order.** Both order jobs by `clockq.policy.ordering` (service levels, no turns within a
  class); the live workers read the standings from the database (clockq/jobs/order.py).
- **The service ladder is compressed too.** `compress` divides the ladder's rungs as it divides
  run times (`plan.compress_ladder`), so a job crosses the same rungs on both sides as in the
  trace: the simulator runs `Config.ladder / compress`, and the live GPU workers must run with
  CLOCKQ_SERVICE_LADDER_S set to the same rungs. Each GPU worker announces its ladder in its
  heartbeat (`service_ladder_s` in /api/queues), and `check_cluster` refuses a cluster whose
  workers run another one, or none, before anything is submitted, naming the setting to start
  it with. (The bench does not start the stack itself: it is a client of any running clockq.)
- **One user.** Every live job is the token's user's, so the simulator is given one user too:
  fair share between users is not part of the comparison.

Where the two usually differ, and why:

- **Switch and claim costs.** A live switch is a real checkpoint, a transition, a broker hop
  and a claim; the simulator uses the line through bench/switch_cost.py's medians (9.5 ms +
  1.2 ms/MB: 10.7 ms for 1 MB). Measured live on one machine with SQLite, a 1 MB switch cost
  some 43 ms (checkpoint 6, restore 2, the rest the requeue, hop and claim), so live slices,
  planned to keep switching within the 5 % overhead budget, were some 800 ms against the
  simulator's 214 ms, and a job arriving behind a queue of its own tier waited longer for its
  turn. `--switch-cost-factor 4` prices switches as measured. A job's first start pays the hop
  and the claim even on an idle GPU, so live waits are never 0.
- **Boundaries and steps.** Every live slice boundary, a continued one included, writes the job
  and a Slice row (about 9 ms here), and a slice ends at the first step boundary after its
  budget (20 ms steps; an RT interrupt, at the next step). A job that never switched runs in
  50-60 ms slices and takes 15-20 % longer than steps * step_ms; after its first switch its
  slices follow its measured switch cost and the overrun falls to about 1 %. A job that waits
  for a GPU waits out the overrun of the job before it.
- **Making way at a boundary.** A running SP, BP or BK job that a waiting job comes before
  leaves live at its next slice boundary; in the simulator at once, if it has had one planned
  slice since it got its GPU (`ordering.leaves_at`). A job that arrives while every GPU runs
  later work therefore waits up to one live slice (some 0.2-0.8 s) longer live.
- **Beat's ticks.** Promotions (and batch chances) happen at beat's 10 s ticks on the wall
  clock; the simulator ticks on a 10 s grid from its time 0. Their phases differ by up to 10 s,
  so a promoted job may start up to one tick earlier or later.
- **Random choices.** Which running job an RT job cuts short is random on both sides, and not
  the same draw.
- **The one-GPU conversion** changes a gang trace's load; both sides carry that change, but the
  numbers are not those of the original trace.
- **Other work.** Jobs that other users run on the cluster meanwhile take GPUs the simulator
  does not know of (a warning says when the queues were not empty at the start); the KPIs of
  /api/kpis count every job in their window, in whole minutes.

A client of the public API, as a user's script would be: plain Python, the standard library,
`requests`, and the core's pure simulator (clockq.replay, clockq.policy); no Django. The API token
comes from the environment (CLOCKQ_API_TOKEN; `python manage.py createtoken USER` makes one),
never from the command line, where other users could read it.
"""

from bench.live_replay.api import TOKEN_ENV, Client, LiveError, check_cluster, token_from_env
from bench.live_replay.compare import compare, kendall
from bench.live_replay.plan import DEFAULT_STATE_KB_CAP, DEFAULT_STEP_MS, LivePlan, convert, simulate
from bench.live_replay.readback import LiveJob, Submitted, fetch_kpis, live_job, submit_all, wait_for_all
from bench.live_replay.render import render
from bench.live_replay.run import run_live

__all__ = [
    "DEFAULT_STATE_KB_CAP",
    "DEFAULT_STEP_MS",
    "TOKEN_ENV",
    "Client",
    "LiveError",
    "LiveJob",
    "LivePlan",
    "Submitted",
    "check_cluster",
    "compare",
    "convert",
    "fetch_kpis",
    "kendall",
    "live_job",
    "render",
    "run_live",
    "simulate",
    "submit_all",
    "token_from_env",
    "wait_for_all",
]
