"""Bad input gets one clear line on stderr and exit code 2, before any worker starts; no traceback."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import pytest

from disttrain.config import JobConfig, apply_overrides, parse_command
from disttrain.config.doctor import DoctorJobConfig
from disttrain.errors import ConfigError
from disttrain.ps.config import PSJobConfig
from disttrain.rl.config import RLJobConfig
from disttrain.testing.launch import together

from conftest import disttrain

pytestmark = pytest.mark.timeout(120)


def assert_one_line_error(proc, *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    line = lines[0]
    assert line.startswith("disttrain: error: ")
    assert "----" not in line and "│" not in line, f"tyro's box leaked into the message: {line}"
    for n in needles:
        assert n in line, line
    return line


BAD_OPTIONS = [
    (["--train.stepz", "3"], ["unknown option --train.stepz", "did you mean --train.steps"]),
    (["--trian.steps", "3"], ["unknown option", "--train.steps"]),
    (["--train.global-batch", "30", "--train.micro-batch", "8"], ["multiple of", "(30)", "try"]),
    (["--parallel.nproc", "512"], ["parallel.nproc (512)", "larger than"]),
    (["--model.module", "no_such_pkg.models:build"], ["cannot import module 'no_such_pkg.models'"]),
    (["--model.module", "json:no_such_fn"], ["has no callable 'no_such_fn'"]),
    (["--parallel.strategy", "fsdpp"], ["fsdpp"]),
    (["--train.steps", "0"], ["train.steps must be >= 1, got 0"]),
    (["--model.n-heads", "5"], ["model.n_heads (5) must divide model.d_model (384)", "try"]),
    (["--train.steps", "many"], ["many"]),
    (["--train.steps", "ten"], ["--train.steps: expected an integer, got 'ten'", "Optimizer steps."]),
    (["--precision.dtype", "fp64"], ["invalid choice 'fp64'", "--precision.dtype", "'bf16'"]),
    (["--train.steps"], ["Missing value for argument '--train.steps'"]),
    (["--config", "/no/such.toml"], ["does not exist"]),
]


@pytest.fixture(scope="module")
def rejected(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[subprocess.CompletedProcess[str], Path]]:
    """`disttrain run` with each of BAD_OPTIONS, from an empty folder of its own, two commands at a time (each is
    an interpreter and torch's import: one core): {the options: (the command, its folder)}."""
    folders = [tmp_path_factory.mktemp("rejected") for _ in BAD_OPTIONS]
    done = together(
        *(
            functools.partial(disttrain, "run", *args, cwd=cwd)
            for (args, _), cwd in zip(BAD_OPTIONS, folders, strict=True)
        ),
        at_once=2,
    )
    return {" ".join(args): (proc, cwd) for (args, _), proc, cwd in zip(BAD_OPTIONS, done, folders, strict=True)}


@pytest.mark.parametrize(("args", "needles"), BAD_OPTIONS)
def test_bad_option_is_one_clear_line(
    rejected: dict[str, tuple[subprocess.CompletedProcess[str], Path]], args: list[str], needles: list[str]
) -> None:
    proc, cwd = rejected[" ".join(args)]
    assert_one_line_error(proc, *needles)
    assert not (cwd / "runs").exists(), "no run folder may be made for a rejected config"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--optim.lr", "fast"],
            "--optim.lr: expected a number, got 'fast'; help: --optim.lr FLOAT  Peak learning rate.",
        ),
        (["--parallel.nproc", "two"], "--parallel.nproc: expected INT or None, got 'two'; help: --parallel.nproc"),
        (["--train.gc-interval", "1.5"], "--train.gc-interval: expected an integer, got '1.5'; help: "),
        (["--train.steps", "0"], "train.steps must be >= 1, got 0"),
        (["--parallel.strategy", "x"], "invalid choice 'x' for argument '--parallel.strategy'. Expected one of"),
    ],
)
def test_tyro_errors_become_one_clean_line(args: list[str], expected: str) -> None:
    # in-process (no CLI start-up): the message apply_overrides makes of tyro's boxed error
    with pytest.raises(ConfigError) as e:
        apply_overrides(JobConfig(), args)
    message = str(e.value)
    assert message.startswith(expected), message
    assert "\n" not in message and "----" not in message and "Error parsing" not in message, message


# every command with a job of sections: the same suggestion for a misspelt option, an old flat flag, or a command
# flag (in-process: parse_command is what each command calls first)
UNKNOWN_OPTIONS = [
    (PSJobConfig, "disttrain ps", ["--ps.sever", "3"], "unknown option --ps.sever; did you mean --ps.servers?"),
    (PSJobConfig, "disttrain ps", ["--servers", "3"], "unknown option --servers; did you mean --ps.servers?"),
    (PSJobConfig, "disttrain ps", ["--run-root", "x"], "unknown option --run-root; did you mean --run.root?"),
    (PSJobConfig, "disttrain ps", ["--checkpoint-every", "2"], "did you mean --checkpoint.interval?"),
    (PSJobConfig, "disttrain ps", ["--plna"], "unknown option --plna; did you mean --plan?"),
    (RLJobConfig, "disttrain rl", ["--rl.actorz", "2"], "unknown option --rl.actorz; did you mean --rl.actors?"),
    (RLJobConfig, "disttrain rl", ["--max-env-steps", "9"], "did you mean --train.max-env-steps?"),
    (JobConfig, "disttrain estimate", ["--nproc", "8"], "unknown option --nproc; did you mean --parallel.nproc?"),
    (JobConfig, "disttrain estimate", ["--jsn"], "unknown option --jsn; did you mean --json?"),
    (JobConfig, "disttrain run", ["--stepz", "3"], "unknown option --stepz; did you mean --train.steps?"),
    (JobConfig, "disttrain run", ["--zzz"], "unknown option --zzz; see `disttrain run --help`"),
    (DoctorJobConfig, "disttrain doctor", ["--quik"], "unknown option --quik; did you mean --quick?"),
    (DoctorJobConfig, "disttrain doctor", ["--doctor.prot", "1"], "did you mean --doctor.port?"),
]


@pytest.mark.parametrize(("job", "prog", "args", "expected"), UNKNOWN_OPTIONS)
def test_an_unknown_option_names_the_closest_known_one(job: type, prog: str, args: list[str], expected: str) -> None:
    from disttrain.cli import doctor, estimate, ps, run

    every = {"ps": ps.FLAGS, "estimate": estimate.FLAGS, "run": run.FLAGS, "doctor": doctor.FLAGS}
    flags = every.get(prog.split()[-1], ())
    with pytest.raises(ConfigError) as e:
        parse_command(job, args, prog, "", flags)
    assert expected in str(e.value), str(e.value)


def test_ps_rl_and_estimate_mistakes_are_one_line_before_any_worker(tmp_path: Path) -> None:
    sever, actors, nproc, checkpoints = together(
        lambda: disttrain("ps", "--ps.sever", "3", cwd=tmp_path),
        lambda: disttrain("rl", "--rl.actorz", "2", cwd=tmp_path),
        lambda: disttrain("estimate", "--nproc", "8", cwd=tmp_path),
        lambda: disttrain("ps", "--ps.mode", "asp", "--checkpoint.interval", "2", cwd=tmp_path),
    )
    assert_one_line_error(sever, "unknown option --ps.sever; did you mean --ps.servers?")
    assert_one_line_error(actors, "unknown option --rl.actorz; did you mean --rl.actors?")
    assert_one_line_error(nproc, "unknown option --nproc; did you mean --parallel.nproc?")
    assert_one_line_error(checkpoints, "checkpoint.interval", "--ps.mode bsp, not 'asp'")
    assert not (tmp_path / "runs").exists(), "no run folder may be made for a rejected config"


@pytest.mark.parametrize("command", ["run", "estimate", "ps", "rl", "doctor"])
def test_every_command_has_the_same_generated_help(tmp_path: Path, command: str) -> None:
    proc = disttrain(command, "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith(f"usage: disttrain {command} [-h] [OPTIONS]"), out[:200]
    assert "--config FILE" in out and "--print-config" in out and "command options" in out
    sections = {"run": "train", "estimate": "parallel", "ps": "ps", "rl": "rl", "doctor": "doctor"}[command]
    assert f"─ {sections} options ─" in out and "─ launch options ─" in out and "--launch.nnodes" in out
    if command != "doctor":  # a job with a run folder
        assert "─ run options ─" in out and "--run.name" in out


@pytest.mark.parametrize(
    ("command", "toml", "key"),
    [
        ("ps", "[ps]\nservers = 3\ntables = [300, 30]\n[train]\nsteps = 5\n", "servers = 3\n"),
        ("rl", '[rl]\nenv_id = "Acrobot-v1"\n[train]\nsolve_return = -100\n', 'env_id = "Acrobot-v1"\n'),
        ("estimate", "[parallel]\nnproc = 8\n", "nproc = 8\n"),
    ],
)
def test_config_toml_and_overrides_for_every_command(tmp_path: Path, command: str, toml: str, key: str) -> None:
    cfg = tmp_path / "job.toml"
    cfg.write_text(toml)
    proc = disttrain(command, "--config", str(cfg), "--launch.max-restarts", "4", "--print-config", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert key in proc.stdout and "max_restarts = 4\n" in proc.stdout, proc.stdout
    cfg.write_text(toml.replace("[train]", "[trian]"))
    bad = disttrain(command, "--config", str(cfg), cwd=tmp_path) if "[train]" in toml else None
    if bad is not None:
        assert_one_line_error(bad, "unknown section [trian]", "'train'")


def test_unknown_toml_key_names_the_closest(tmp_path: Path) -> None:
    cfg = tmp_path / "job.toml"
    cfg.write_text("[train]\nsteps = 5\nmicro_bach = 4\n")
    assert_one_line_error(disttrain("run", "--config", str(cfg), cwd=tmp_path), "train.micro_bach", "train.micro_batch")
    cfg.write_text("[trainn]\nsteps = 5\n")
    assert_one_line_error(disttrain("run", "--config", str(cfg), cwd=tmp_path), "[trainn]", "'train'")


def test_print_config_resolves_toml_then_overrides(tmp_path: Path) -> None:
    cfg = tmp_path / "job.toml"
    cfg.write_text('[train]\nsteps = 500\nmicro_batch = 4\n[parallel]\nstrategy = "auto"\n')
    proc = disttrain("run", "--config", str(cfg), "--train.steps", "7", "--print-config", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "steps = 7\n" in out and "micro_batch = 4\n" in out
    assert 'strategy = "ddp"' in out and "nproc = 2" in out  # auto resolved on this 2-rank CPU default


def test_unknown_command_and_missing_script(tmp_path: Path) -> None:
    assert_one_line_error(disttrain("trian", cwd=tmp_path), "unknown command 'trian'")
    assert_one_line_error(disttrain("launch", "-n", "2", "nope.py", cwd=tmp_path), "script 'nope.py' does not exist")


def test_run_help_lists_every_option_and_the_config_flags(tmp_path: Path) -> None:
    proc = disttrain("run", "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    flags = ("--config FILE", "--print-config", "--train.steps", "--parallel.forward-prefetch", "--precision.dtype")
    for flag in flags:
        assert flag in proc.stdout, flag


def test_wrong_toml_type_names_the_key_and_the_value(tmp_path: Path) -> None:
    cfg = tmp_path / "job.toml"
    cfg.write_text('[train]\nsteps = "ten"\n')
    assert_one_line_error(
        disttrain("run", "--config", str(cfg), cwd=tmp_path), "train.steps must be an integer, got 'ten'"
    )
    cfg.write_text('[precision]\ndtype = "fp64"\n')
    proc = disttrain("run", "--config", str(cfg), cwd=tmp_path)
    assert_one_line_error(proc, "precision.dtype must be one of 'auto', 'fp32', 'bf16', 'fp16', got 'fp64'")


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "does not exist"),
        (b"", "is empty"),
        (b"\xff\xfe\x00 not text", "is not UTF-8 text"),
        (b"too short", "too short for context"),
    ],
)
def test_bad_data_file_is_one_line_before_any_worker(tmp_path: Path, content: bytes | None, needle: str) -> None:
    data = tmp_path / "corpus.txt"
    if content is not None:
        data.write_bytes(content)
    # forced strategy: a memory plan that fails is only a warning then, so the file must be checked before it
    proc = disttrain("run", "--data.path", str(data), "--parallel.strategy", "ddp", cwd=tmp_path)
    assert_one_line_error(proc, "data.path", needle)
    assert not (tmp_path / "runs").exists(), "no run folder may be made for a rejected config"


def save_checkpoints(folder: Path, steps: list[int]) -> None:
    """Complete checkpoints of a tiny state, in this process (no process group)."""
    import torch

    from disttrain.checkpoint import CheckpointManager
    from disttrain.config import CheckpointConfig

    mgr = CheckpointManager(folder, CheckpointConfig(async_mode="off", keep_latest=10))
    for step in steps:
        mgr.save(step, {"app": {"w": torch.full((4,), float(step))}})
    mgr.close()


@pytest.mark.slow
def test_resume_from_a_step_that_does_not_exist_lists_the_steps_there_are(tmp_path: Path) -> None:
    from disttrain.checkpoint import CheckpointManager
    from disttrain.config import CheckpointConfig
    from disttrain.errors import CheckpointError

    folder = tmp_path / "runs" / "job" / "checkpoints"
    save_checkpoints(folder, [10, 20])
    proc = disttrain("run", "--run.name", "job", "--checkpoint.resume", "999", cwd=tmp_path)
    line = assert_one_line_error(proc, "no checkpoint for step 999", "the steps there are 10, 20")
    assert "COMMITTED" not in line
    assert not (tmp_path / "runs" / "job" / "config.toml").exists(), "rejected before the run folder is written"
    # the same in the workers, where the manager resolves checkpoint.resume
    with pytest.raises(CheckpointError, match=r"no checkpoint for step 999 .*the steps there are 10, 20"):
        CheckpointManager(folder, CheckpointConfig()).resolve("999")
    info = CheckpointManager(folder, CheckpointConfig()).resolve("20")
    assert info is not None and info.step == 20
    # no run name: a new run folder, which can hold no checkpoint yet
    proc = disttrain("run", "--checkpoint.resume", "999", cwd=tmp_path)
    assert_one_line_error(proc, "no checkpoint for step 999", "--run.name")
    proc = disttrain("run", "--checkpoint.resume", str(tmp_path / "nowhere" / "step-00000010"), cwd=tmp_path)
    assert_one_line_error(proc, "does not exist")
