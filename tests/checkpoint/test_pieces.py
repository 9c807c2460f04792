"""The checkpoint's pieces, each alone in one process: ModelOptimState, the staging copy, shard tensor records
(byte-identical to ``torch.save``), the fast loader's zip parsing, direct I/O and background niceness."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from disttrain.checkpoint import ModelOptimState
from disttrain.config import CheckpointConfig

pytestmark = pytest.mark.timeout(400)


def test_model_optim_state_equals_get_state_dict_across_saves_and_replaced_parameters() -> None:
    # ModelOptimState keeps get_state_dict's analysis of the model between saves; it must give what
    # get_state_dict gives, also after a parameter object is replaced (in the model and the optimizer).
    from torch.distributed.checkpoint.state_dict import get_state_dict

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        opt.zero_grad()

    def check(ours: dict[str, Any]) -> None:
        msd, osd = get_state_dict(model, opt)
        assert ours["model"].keys() == msd.keys() and all(torch.equal(ours["model"][k], msd[k]) for k in msd)
        assert ours["optim"]["state"].keys() == osd["state"].keys()
        for fqn, st in osd["state"].items():
            assert all(torch.equal(ours["optim"]["state"][fqn][k], v) for k, v in st.items())
        assert ours["optim"]["param_groups"] == osd["param_groups"]

    state = ModelOptimState(model, opt)
    step()
    check(state.state_dict())
    step()
    check(state.state_dict())  # from the kept analysis
    new_weight = nn.Parameter(model[2].weight.detach() * 2)
    old_weight, model[2].weight = model[2].weight, new_weight
    opt.param_groups[0]["params"][2] = new_weight
    opt.state[new_weight] = opt.state.pop(old_weight)
    step()
    check(state.state_dict())  # made again for the new parameter


def test_staging_copies_the_state_into_reused_buffers_sharing_what_the_source_shares() -> None:
    # The async save's copy of the state: equal values, never aliasing the live tensors, views of one storage
    # staying views of one staged storage, containers and leaves kept, the same buffers reused by the next save.
    import io

    from disttrain.checkpoint.staging import BatchedCopyStager

    base = torch.arange(12.0)
    state: dict[str, Any] = {
        "w": torch.randn(4, 3),
        "t": torch.randn(3, 5).t(),
        "view_a": base[2:6],
        "view_b": base.view(3, 4),
        "groups": [{"lr": 0.1, "betas": (0.9, 0.95), "params": ["w", "t"], "dtype": torch.bfloat16}],
        "blob": io.BytesIO(b"rng"),  # anything else: DCP's own deep copy
    }
    stager = BatchedCopyStager(share_memory=False)
    staged = stager.stage(state)
    for key in ("w", "t", "view_a", "view_b"):
        assert torch.equal(staged[key], state[key]) and staged[key].stride() == state[key].stride()
        assert staged[key].untyped_storage().data_ptr() != state[key].untyped_storage().data_ptr()
    assert staged["view_a"].untyped_storage().data_ptr() == staged["view_b"].untyped_storage().data_ptr()
    assert staged["groups"] == state["groups"] and staged["groups"] is not state["groups"]
    assert type(staged["groups"][0]["betas"]) is tuple
    assert staged["blob"].getvalue() == b"rng" and staged["blob"] is not state["blob"]
    state["w"].add_(1.0)
    again = stager.stage(state)
    assert torch.equal(again["w"], state["w"])
    assert again["w"].untyped_storage().data_ptr() == staged["w"].untyped_storage().data_ptr()  # buffers reused


@pytest.mark.parametrize(
    "tensor",
    [torch.arange(1000.0), torch.randn(3, 4, 5).bfloat16(), torch.tensor(3), torch.zeros(0), torch.ones(7).long()],
    ids=["fp32", "bf16-3d", "scalar", "empty", "int64"],
)
def test_tensor_data_is_found_from_the_zip_head_alone(tensor: torch.Tensor) -> None:
    # The loader finds a shard tensor's raw bytes from the first 4 KiB of its torch.save zip, without the central
    # directory: the same offset the zip's own index gives, and the same bytes.
    import io

    from disttrain.checkpoint.reader import raw_tensor_data_from_head

    buf = io.BytesIO()
    torch.save(tensor, buf)
    data = buf.getvalue()
    found = raw_tensor_data_from_head(data[:4096], len(data), tensor.dtype, tuple(tensor.shape))
    assert found is not None
    offset, nbytes = found
    assert offset == torch._C.PyTorchFileReader(io.BytesIO(data)).get_record_offset("data/0")
    assert data[offset : offset + nbytes] == tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
    assert nbytes == tensor.numel() * tensor.element_size()
    # anything not exactly as expected is left to DCP's own path
    assert raw_tensor_data_from_head(data[:4096], len(data), torch.float64, tuple(tensor.shape)) is None
    view = io.BytesIO()
    torch.save(torch.arange(10.0)[2:], view)  # a view into a larger storage: not one plain tensor
    assert raw_tensor_data_from_head(view.getvalue(), len(view.getvalue()), torch.float32, (8,)) is None


_RECORD_CASES = {
    "fp32-2d": torch.randn(64, 32),
    "bf16": torch.randn(7).bfloat16(),
    "scalar": torch.tensor(3.0),
    "int8-16-bytes": torch.randn(4, 4).to(torch.int8),  # as long as a zip record name: found by address, not size
    "transposed": torch.randn(5, 4).t(),
    "bool": torch.rand(9) > 0.5,
    "large": torch.randn(300_000),  # > 1 MB: written in one piece, never copied into the template
}


@pytest.mark.parametrize("name", list(_RECORD_CASES))
def test_tensor_records_are_the_bytes_torch_save_writes(name: str) -> None:
    # Shard files hold each tensor as a torch.save zip. write_tensor_record writes it from a cached head and tail
    # around the raw data (no pickling): the bytes must be exactly torch.save's, for this tensor and for another
    # of the same layout that reuses the template, and plain torch.load(weights_only=True) must read them back.
    import io

    from disttrain.checkpoint.records import write_tensor_record, zip_crc32_off

    tensor = _RECORD_CASES[name]
    other = torch.empty_like(tensor).copy_(tensor.flip(0) if tensor.dim() else tensor + 1)
    with zip_crc32_off():
        for t in (tensor, other):
            ours, theirs = io.BytesIO(), io.BytesIO()
            assert write_tensor_record(ours, t)
            torch.save(t, theirs)
            assert ours.getvalue() == theirs.getvalue()
            ours.seek(0)
            assert torch.equal(torch.load(ours, weights_only=True), t)


def test_tensor_records_leave_unusual_tensors_to_torch_save() -> None:
    import io

    from disttrain.checkpoint.records import write_tensor_record, zip_crc32_off

    unusual = [torch.zeros(0), torch.ones(3, requires_grad=True), torch.arange(10.0)[2:5], nn.Parameter(torch.ones(2))]
    with zip_crc32_off():
        for t in unusual:
            buf = io.BytesIO()
            assert not write_tensor_record(buf, t)
            assert buf.tell() == 0
    buf = io.BytesIO()  # with the zip CRC on, records would carry a checksum of the data: torch.save's job
    assert not write_tensor_record(buf, torch.ones(3))


def test_shard_files_are_byte_identical_to_dcps_own_writer(tmp_path: Path) -> None:
    # The whole shard file, written through our writer (O_DIRECT where the file system has it, records without
    # pickling), equals what DCP's stock FileSystemWriter writes for the same state, and DCP's stock reader loads it.
    import torch.distributed.checkpoint as dcp

    from disttrain.checkpoint.records import zip_crc32_off
    from disttrain.checkpoint.writer import ChecksummingWriter

    state: dict[str, Any] = {f"t{i}": t for i, t in enumerate(_RECORD_CASES.values())}
    state |= {"empty": torch.zeros(0, 3), "slice": torch.arange(10.0)[2:5], "extra": {"epoch": 3, "names": ["a"]}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "no process group: assuming a single process"
        with zip_crc32_off():
            dcp.save(state, storage_writer=dcp.FileSystemWriter(tmp_path / "stock"), no_dist=True)
        dcp.save(state, storage_writer=ChecksummingWriter(tmp_path / "ours", 0, 1, {}), no_dist=True)
        shards = sorted(p.name for p in (tmp_path / "stock").glob("*.distcp"))
        assert shards and shards == sorted(p.name for p in (tmp_path / "ours").glob("*.distcp"))
        for shard in shards:
            assert (tmp_path / "ours" / shard).read_bytes() == (tmp_path / "stock" / shard).read_bytes()
        back: dict[str, Any] = {k: torch.zeros_like(v) for k, v in state.items() if isinstance(v, torch.Tensor)}
        back["extra"] = {"epoch": None, "names": None}  # DCP loads into the keys it is given
        dcp.load(back, storage_reader=dcp.FileSystemReader(tmp_path / "ours"), no_dist=True)
    assert all(torch.equal(back[k], v) for k, v in state.items() if isinstance(v, torch.Tensor))
    assert back["extra"] == state["extra"]


def test_direct_io_shard_files_hold_exactly_what_was_written(tmp_path: Path) -> None:
    # Shard files bypass the page cache (O_DIRECT, aligned buffers written by a helper thread while the next
    # fills): odd-sized writes across several buffers must land byte for byte, with the size and CRC32 recorded.
    import random
    import zlib

    from disttrain.checkpoint.direct_io import DIRECT_CHUNK, open_direct
    from disttrain.checkpoint.writer import ChecksummingFileSystem

    probe = open_direct(tmp_path / "probe.distcp")
    if probe is None:
        pytest.skip("this file system takes no O_DIRECT (the buffered path is used there)")
    os.close(probe)
    rng = random.Random(0)
    data = rng.randbytes(2 * DIRECT_CHUNK + 3 * 4096 + 17)
    fs = ChecksummingFileSystem(direct_io=True)
    path = tmp_path / "__0_0.distcp"
    with fs.create_stream(path, "wb") as f:
        pos = 0
        while pos < len(data):
            n = rng.choice([1, 7, 4096, 65_537, 3 << 20])
            f.write(data[pos : pos + n])
            pos = min(pos + n, len(data))
            assert f.tell() == pos
    assert path.read_bytes() == data
    assert fs.sums["__0_0.distcp"] == (len(data), zlib.crc32(data))
    with pytest.raises(RuntimeError, match="serializer failed"), fs.create_stream(tmp_path / "__1_0.distcp", "wb") as f:
        f.write(data[: DIRECT_CHUNK + 5])
        raise RuntimeError("serializer failed")
    assert "__1_0.distcp" not in fs.sums  # a failed file is never counted as written


def test_direct_io_falls_back_to_buffered_when_the_file_system_refuses_a_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Some file systems open with O_DIRECT and then want another alignment (EINVAL): the file goes on buffered.
    import errno
    import fcntl
    import zlib

    import disttrain.checkpoint.direct_io as ck
    from disttrain.checkpoint.writer import ChecksummingFileSystem

    probe = ck.open_direct(tmp_path / "probe.distcp")
    if probe is None:
        pytest.skip("this file system takes no O_DIRECT")
    os.close(probe)
    real_pwrite, refused = os.pwrite, []

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(ck.os, "pwrite", pwrite)
    data = os.urandom(ck.DIRECT_CHUNK + 1000)
    fs = ChecksummingFileSystem(direct_io=True)
    with fs.create_stream(tmp_path / "__0_0.distcp", "wb") as f:
        f.write(data)
    assert refused == [0]  # refused once, then buffered
    assert (tmp_path / "__0_0.distcp").read_bytes() == data
    assert fs.sums["__0_0.distcp"] == (len(data), zlib.crc32(data))


def test_background_threads_get_the_configured_niceness_never_the_main_thread() -> None:
    import threading

    from disttrain.checkpoint.direct_io import lower_this_thread

    seen: dict[str, int] = {}

    def worker() -> None:
        lower_this_thread(7)
        seen["worker"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    main_before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    t = threading.Thread(target=worker)
    t.start()
    t.join()
    lower_this_thread(7)  # from the main thread (a sync save): ignored
    assert seen["worker"] == max(7, main_before)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main_before


def test_background_nice_out_of_range_is_a_config_error() -> None:
    from disttrain.errors import ConfigError

    with pytest.raises(ConfigError, match=r"checkpoint.background_nice must be a niceness from 0 to 19, got 25"):
        CheckpointConfig(background_nice=25)


class _RunsCode:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("this would have run",))


def test_a_planted_rng_file_is_refused_in_one_line_that_names_it(tmp_path: Path) -> None:
    """rng/rank0.pt that is no tensor file: torch's multi-line advice to load it with weights_only=False was
    printed; now one line names the file, why, and what to resume from instead."""
    import pickle

    from disttrain.checkpoint.layout import CheckpointInfo
    from disttrain.checkpoint.manager import CheckpointManager
    from disttrain.config import CheckpointConfig
    from disttrain.errors import CheckpointError

    step = tmp_path / "step-00000008"
    (step / "rng").mkdir(parents=True)
    (step / "rng" / "rank0.pt").write_bytes(pickle.dumps(_RunsCode()))
    manager = CheckpointManager(tmp_path, CheckpointConfig())
    with pytest.raises(CheckpointError) as e:
        manager._load_rng(step / "rng" / "rank0.pt", CheckpointInfo(step, 8, True, None, {}))
    message = str(e.value)
    assert message.startswith("rng/rank0.pt refused: not a plain tensor file, damaged or tampered"), message
    assert "\n" not in message and "weights_only` set to `False" not in message and "no other complete" in message
