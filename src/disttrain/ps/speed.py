"""The speed a parameter-server job will reach (``disttrain ps --plan``): the arithmetic of one BSP step from
measured costs and links. Measuring them is the job's (:mod:`disttrain.jobs.ps_plan`); nothing here times or
starts anything.

One BSP step, with ``U[t][s]`` the distinct rows trainer t reads from and pushes to server s per step:

* compute: a trainer's step on its batch (the step's samples drawn, rows gathered, forward, backward,
  gradients summed per row, Adam), a server's update (every trainer's pushes applied, the next rows read), and
  each message's handling at both ends (half the round trip of a small call within a node, which is CPU);
* messages: trainer t sends server s its pushes (U ids and U rows of gradients), the ids it reads next (U ids)
  and, to server 0, its dense gradient; the answer carries the rows and the mean dense gradient. A message to
  one's own server (colocated) stays in the process; within a node it crosses the ``rpc`` link, across nodes
  the ``rpc_inter`` link. The messages' time is a round trip, plus the sends' bytes on the busiest direction of
  a link at its rate, then the answers' (an answer leaves once every trainer's send has arrived); overlapped,
  a direction carries one step's sends and the other's answers at once (a trainer's sends to a server on the
  other node share it with that node's server's answers), so the busiest direction's bytes of both;
* the step: plain, compute + messages + the server's update; overlapped (``ps.overlap``), the larger of a
  process's CPU time (its trainer's and its server's work) and a message's round trip (its CPU at both ends,
  its travel and the server's update): a step's message travels while the next step computes. A node with
  more processes than cores shares them.
"""

from __future__ import annotations

from dataclasses import dataclass

from disttrain.ps.config import PSJobConfig

MESSAGE_BYTES = 1024
"""A step message's bookkeeping beyond its tensors (pickled names, counts, clock, loss), each way."""

Link = tuple[float, float]
"""(round trip of a small call in s, one-way payload rate in bytes/s)."""


@dataclass(frozen=True)
class StepCosts:
    """What one BSP step costs on this host, measured on the job's own samples and model."""

    trainer_s: float
    """One trainer's compute per step, on one thread."""
    server_s: float
    """One server's update per step (every trainer's pushes to it, and their next reads), on one thread."""
    rows: tuple[tuple[float, ...], ...]
    """``rows[t][s]``: the distinct rows trainer t reads from (and pushes to) server s per step, on average."""
    dense_params: int
    dim: int
    measured: str = ""
    """How the trainer's step was timed, for the plan's line."""
    message_cpu_s: float = 0.0
    """A remote message's CPU at each end, as the job's own processes spend it on this host (0: half the round
    trip of a small call within a node, as doctor measured it)."""


@dataclass(frozen=True)
class Prediction:
    samples_per_s: float
    step_s: float
    cpu_s: float
    """The busiest process's CPU time per step (trainer and, colocated, server work; shared cores counted)."""
    messages_s: float
    """A step's messages: round trip and bytes on the busiest link direction (sends, then answers)."""
    bytes_per_step: int
    """Every message of a step, both ways (messages within a process excluded)."""
    cross_bytes: int
    """Of which across nodes."""
    bound: str
    """'compute' or 'messages': what sets the step."""


def message_bytes(rows: float, dim: int, dense_bytes: int) -> tuple[float, float]:
    """(sent, answered) bytes of one step message with ``rows`` distinct rows: int64 ids and fp32 gradients of
    the pushes, the ids to read; the rows read; ``dense_bytes`` each way (server 0's, when the dense gradient
    travels in the message)."""
    return rows * (8 + 4 * dim + 8) + MESSAGE_BYTES + dense_bytes, rows * 4 * dim + MESSAGE_BYTES + dense_bytes


@dataclass
class Traffic:
    """A step's bytes per directed pair of nodes (a node to itself: within it), sends and answers apart."""

    sends: dict[tuple[int, int], float]
    answers: dict[tuple[int, int], float]
    round_trip: float
    """The slowest round trip among the links the messages cross."""


def traffic(cfg: PSJobConfig, costs: StepCosts, links: dict[str, Link], per: int) -> Traffic:
    """Every message of a BSP step between processes (``per`` of them on each node, in rank order)."""
    ps, dense_bytes = cfg.ps, 4 * costs.dense_params
    out = Traffic({}, {}, 0.0)
    for t in range(ps.trainers):
        for s in range(ps.servers):
            where = ps.server_rank(s)
            if ps.colocated and where == t:
                continue  # its own shard: read and updated in place
            in_message = s == 0 and ps.dense_where == "trainers"
            sent, answered = message_bytes(costs.rows[t][s], costs.dim, dense_bytes if in_message else 0)
            a, b = t // per, where // per
            out.sends[a, b] = out.sends.get((a, b), 0.0) + sent
            out.answers[b, a] = out.answers.get((b, a), 0.0) + answered
            out.round_trip = max(out.round_trip, _link(links, a, b)[0])
    return out


def _link(links: dict[str, Link], a: int, b: int) -> Link:
    return links["rpc"] if a == b else links.get("rpc_inter", links["rpc"])


def _busiest(links: dict[str, Link], phase: dict[tuple[int, int], float]) -> float:
    """Seconds of the busiest direction of a link carrying ``phase``'s bytes."""
    return max((n / _link(links, a, b)[1] for (a, b), n in phase.items()), default=0.0)


def messages_time(cfg: PSJobConfig, costs: StepCosts, links: dict[str, Link], nnodes: int, flow: Traffic) -> float:
    """A step's messages: the round trip and the bytes (plain steps send, then answer; overlapped ones keep each
    direction of a link busy with both at once), and the dense part's own traffic when it is not in them."""
    ps, per, dense_bytes = cfg.ps, cfg.ps.processes // nnodes, 4 * costs.dense_params
    if ps.overlapped:  # one direction of a link carries its sends and answers together
        both = {pair: flow.sends.get(pair, 0.0) + flow.answers.get(pair, 0.0) for pair in {*flow.sends, *flow.answers}}
        seconds = flow.round_trip + _busiest(links, both)
    else:
        seconds = flow.round_trip + _busiest(links, flow.sends) + _busiest(links, flow.answers)
    if ps.dense_where == "server":  # the dense weights read from server 0 and its gradient pushed there
        far = _link(links, 0, ps.server_rank(0) // per)
        seconds += 2 * far[0] + 2 * dense_bytes / far[1]
    elif ps.dense_where == "ddp" and ps.trainers > 1:  # a gloo ring all-reduce over the trainers
        lat, rate = links.get("inter" if nnodes > 1 else "intra", links.get("intra", (1e-4, 1e9)))
        n = ps.trainers
        seconds += 2 * (n - 1) * (lat + dense_bytes / n / rate)
    return seconds


def predict(cfg: PSJobConfig, costs: StepCosts, links: dict[str, Link], nnodes: int, cores: float) -> Prediction:
    """The samples/s of ``cfg``'s BSP job over ``nnodes`` nodes of ``cores`` cores each, with ``links``:
    ``rpc`` (within a node) and ``rpc_inter`` (across nodes; the ``rpc`` figures where absent), and for
    ``ps.dense ddp`` the gloo all-reduce links ``intra`` / ``inter`` as the same (latency, rate) pairs."""
    ps = cfg.ps
    per = ps.processes // nnodes
    flow = traffic(cfg, costs, links, per)
    messages_s = messages_time(cfg, costs, links, nnodes, flow)
    share = max(1.0, per / cores)  # more processes than cores on a node: they take turns
    end = costs.message_cpu_s or links["rpc"][0] / 2  # a message's CPU at each end
    remote = ps.servers - 1 if ps.colocated else ps.servers  # messages a trainer sends (and a server answers)
    trainer_cpu = (costs.trainer_s + remote * end) * share
    server_cpu = (costs.server_s + (ps.trainers - (1 if ps.colocated else 0)) * end) * share
    cpu = trainer_cpu + server_cpu if ps.colocated else max(trainer_cpu, server_cpu)
    if ps.overlapped:  # the message's own CPU at the trainer's end, its travel and the update: its round trip
        trip = end * share + messages_s + server_cpu
        step, busy = max(cpu, trip), cpu >= trip
    else:
        step, busy = trainer_cpu + messages_s + server_cpu, trainer_cpu + server_cpu >= messages_s
    every = [*flow.sends.items(), *flow.answers.items()]
    total, cross = sum(n for _, n in every), sum(n for (a, b), n in every if a != b)
    bound = "compute" if busy else "messages"
    return Prediction(ps.trainers * cfg.train.batch / step, step, cpu, messages_s, int(total), int(cross), bound)
