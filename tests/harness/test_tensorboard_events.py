"""The harness's hand-written tfevents files, read back by the real `tensorboard` package; which
reports become which tags (Determined's BatchMetricWriter); the upload to checkpoint storage."""

from __future__ import annotations

import math
import struct
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.storage import from_config
from harness.tensorboard import events
from harness.tensorboard.events import scalars_for_report, to_float32
from harness.tensorboard.sync import TensorboardSync, sync_path
from harness.tensorboard.writer import EventFileWriter
from tests.harness.conftest import cluster_env


def read_events(logdir: Path) -> list[Any]:
    """Every event of every tfevents file under logdir, in file-name order, via TensorBoard's loader
    (which checks both CRCs of each record)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    out = []
    for path in sorted(logdir.rglob("*tfevents*")):
        out.extend(EventFileLoader(str(path)).Load())
    return out


def _fields(data: bytes) -> list[tuple[int, Any]]:
    """(field number, value) of a protobuf message: varints, 64/32-bit words, length-delimited."""
    out, i = [], 0
    while i < len(data):
        key, i = _read_varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(data, i)
        elif wire == 1:
            value, i = data[i:i + 8], i + 8
        elif wire == 5:
            value, i = data[i:i + 4], i + 4
        else:
            assert wire == 2, wire
            n, i = _read_varint(data, i)
            value, i = data[i:i + n], i + n
        out.append((number, value))
    return out


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = data[i]
        i += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, i


def _scalars_without_tensorboard(logdir: Path) -> list[tuple[str, float, int]]:
    """The tests/pythons interpreters have no `tensorboard` package: read the TFRecords by the
    format's definition (both CRCs checked) instead. The main suite uses the real reader."""
    out = []
    for path in sorted(logdir.rglob("*tfevents*")):
        raw, i = path.read_bytes(), 0
        while i < len(raw):
            header = raw[i:i + 8]
            (length,) = struct.unpack("<Q", header)
            assert struct.unpack("<I", raw[i + 8:i + 12])[0] == events.masked_crc32c(header)
            data = raw[i + 12:i + 12 + length]
            assert struct.unpack("<I", raw[i + 12 + length:i + 16 + length])[0] == events.masked_crc32c(data)
            i += 16 + length
            fields = dict(_fields(data))
            step = fields.get(2, 0)
            step = step - (1 << 64) if step >= 1 << 63 else step
            for _, value in _fields(fields.get(5, b"")):
                v = dict(_fields(value))
                out.append((v[1].decode(), struct.unpack("<f", v[2])[0], step))
    return out


def read_scalars(logdir: Path) -> list[tuple[str, float, int]]:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return _scalars_without_tensorboard(logdir)
    out = []
    for ev in read_events(logdir):
        if ev.HasField("file_version"):
            assert ev.file_version == "brain.Event:2"
        for v in ev.summary.value:
            # The loader migrates simple_value to the scalars plugin's form, as TensorBoard shows it.
            assert v.metadata.plugin_data.plugin_name == "scalars"
            (value,) = v.tensor.float_val
            out.append((v.tag, value, ev.step))
    return out


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@given(st.binary(max_size=300))
def test_crc32c_matches_the_reference(data: bytes) -> None:
    google_crc32c = pytest.importorskip("google_crc32c")  # not in tests/pythons' venvs

    assert events.crc32c_pure(data) == google_crc32c.value(data)
    # TFRecord's known answer: crc32c("123456789") = 0xE3069283
    assert events.crc32c_pure(b"123456789") == 0xE3069283


scalar_lists = st.lists(st.tuples(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30),
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.integers(min_value=-(2 ** 63), max_value=2 ** 63 - 1)), max_size=40)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scalars=scalar_lists, max_file_bytes=st.sampled_from([64, 1 << 20]))
def test_every_scalar_reads_back_with_the_real_reader(tmp_path_factory: pytest.TempPathFactory,
                                                      scalars: list[tuple[str, float, int]],
                                                      max_file_bytes: int) -> None:
    logdir = tmp_path_factory.mktemp("tb")
    w = EventFileWriter(logdir, max_file_bytes=max_file_bytes)
    for i, (tag, value, step) in enumerate(scalars):
        w.add_scalar(tag, value, step, wall_time=1700000000.5 + i)
        if i % 3 == 0:
            w.flush()
    w.close()
    got = read_scalars(logdir)
    assert len(got) == len(scalars)
    for (tag, value, step), (gtag, gvalue, gstep) in zip(scalars, got):
        assert (gtag, gstep) == (tag, step)
        assert same(gvalue, to_float32(value))
    if max_file_bytes == 64 and len(scalars) > 3:
        assert len(w.paths) > 1  # rolled: TensorBoard still reads them in order
    pytest.importorskip("tensorboard")
    wall_times = [ev.wall_time for ev in read_events(logdir) if ev.summary.value]
    assert wall_times == [1700000000.5 + i for i in range(len(scalars))]


def test_float32_rounding_and_overflow() -> None:
    assert to_float32(0.1) == struct.unpack("<f", struct.pack("<f", 0.1))[0]
    assert to_float32(1e300) == math.inf and to_float32(-1e300) == -math.inf


def test_training_report_tags_as_determined() -> None:
    batches = [{"loss": 4.0, "acc": 0.1}, {"loss": 3.0, "acc": 0.2}, {"loss": 2.0, "acc": 0.3}]
    got = scalars_for_report("training", 30, {"loss": 3.0, "lr": 0.01, "note": "x", "hist": [1, 2]}, batches)
    assert got == [("Determined/loss", 4.0, 27), ("Determined/acc", 0.1, 27),
                   ("Determined/loss", 3.0, 28), ("Determined/acc", 0.2, 28),
                   ("Determined/loss", 2.0, 29), ("Determined/acc", 0.3, 29),
                   ("Determined/lr", 0.01, 30)]  # averaged loss is in the batches; strings, lists skipped


def test_validation_report_tags_as_determined() -> None:
    np = pytest.importorskip("numpy")  # not in tests/pythons' venvs

    got = scalars_for_report("validation", 10, {"loss": 1.5, "val_acc": np.float32(0.5), "validation_loss": 2,
                                                "ok": True, "arr": np.array(3.0), "vec": np.array([1.0])})
    assert got == [("Determined/val_loss", 1.5, 10), ("Determined/val_acc", 0.5, 10),
                   ("Determined/validation_loss", 2.0, 10), ("Determined/val_ok", 1.0, 10),
                   ("Determined/val_arr", 3.0, 10)]
    assert scalars_for_report("custom", 10, {"x": 1.0}) == []


class CountingStorage:
    """A shared_fs storage that counts uploads and can fail them (a storage outage)."""

    def __init__(self, root: Path) -> None:
        self.inner = from_config({"type": "shared_fs", "host_path": str(root)})
        self.calls: list[str] = []
        self.fail = False
        self.lock = threading.Lock()

    def upload_file(self, src: Path, key: str) -> None:
        with self.lock:
            self.calls.append(key)
        if self.fail:
            raise OSError("storage down")
        self.inner.upload_file(src, key)

    def describe(self) -> str:
        return self.inner.describe()


def test_sync_uploads_changed_files_batched_and_retries_failures(tmp_path: Path) -> None:
    storage = CountingStorage(tmp_path / "store")
    base = tmp_path / "local"
    path = sync_path("c1", 3, 7)
    assert path == "c1/tensorboard/experiment/3/trial/7"
    sync = TensorboardSync(storage, base, path, min_interval_s=0.3).start()  # type: ignore[arg-type]
    w = EventFileWriter(base)
    t0 = time.monotonic()
    for step in range(1, 51):  # fifty reports in well under a second: one or two passes, not fifty
        w.add_scalar("Determined/loss", 1.0 / step, step)
        w.flush()
        sync.request()
    (base / "notes.txt").write_text("not a TensorBoard file")
    deadline = time.monotonic() + 5
    while not storage.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert storage.calls and time.monotonic() - t0 < 5
    storage.fail = True
    w.add_scalar("Determined/loss", 0.5, 51)
    w.flush()
    sync.request()
    time.sleep(0.8)
    assert sync.failures >= 1
    storage.fail = False
    w.close()
    sync.close()
    assert len(storage.calls) <= 6, storage.calls  # passes, not reports
    stored = tmp_path / "store" / path
    assert not (stored / "notes.txt").exists()
    assert [s for s in read_scalars(stored)] == [("Determined/loss", to_float32(1.0 / s), s) for s in range(1, 51)] + [
        ("Determined/loss", 0.5, 51)]
    # Nothing changed since: a further pass uploads nothing.
    assert sync.sync_once() == 0


@pytest.mark.parametrize("kind", ["s3", "gcs"])
def test_sync_to_buckets(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    pytest.importorskip("boto3" if kind == "s3" else "google.cloud.storage")  # not in tests/pythons' venvs
    config = request.getfixturevalue("s3_bucket" if kind == "s3" else "gcs_bucket")
    storage = from_config(config)
    base = tmp_path / "local"
    w = EventFileWriter(base)
    w.add_scalar("Determined/val_loss", 0.25, 10)
    w.close()
    sync = TensorboardSync(storage, base, sync_path("c1", 3, 7))
    assert sync.close() == 1
    key = f"{config['prefix']}/c1/tensorboard/experiment/3/trial/7/{w.paths[0].name}"
    out = tmp_path / "fetched"
    out.mkdir()
    if kind == "s3":
        import boto3

        s3 = boto3.client("s3", endpoint_url=config["endpoint_url"], aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
        s3.download_file(config["bucket"], key, str(out / w.paths[0].name))
    else:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage as gcs

        client = gcs.Client(project="shipyard-test", credentials=AnonymousCredentials())
        client.bucket(config["bucket"]).blob(key).download_to_filename(str(out / w.paths[0].name))
    assert read_scalars(out) == [("Determined/val_loss", 0.25, 10)]


@pytest.mark.integration
def test_core_api_writes_and_syncs_every_report(fake_master: Any, tmp_path: Path) -> None:
    import harness.core

    fake_master.searcher_ops = [{"op": {"validateAfter": {"length": 20}}, "completed": False},
                                {"op": None, "completed": True}]
    with harness.core.init(env=cluster_env(fake_master, tmp_path / "ckpts")) as ctx:
        local = ctx.train.get_tensorboard_path()
        assert local is not None and local.is_dir()
        with pytest.raises(RuntimeError, match="MANUAL"):
            ctx.train.upload_tensorboard_files()
        for step in range(1, 21):
            ctx.train.report_training_metrics(step, {"loss": 1.0 / step, "tag": "skipped"})
            if step % 10 == 0:
                ctx.train.report_validation_metrics(step, {"val_loss": 0.5 / step, "accuracy": step / 20})
        ctx.train.report_metrics("custom", 20, {"x": 1.0})  # Determined writes only training and validation
    stored = tmp_path / "ckpts" / "cluster-1" / "tensorboard" / "experiment" / "3" / "trial" / "7"
    want = [("Determined/loss", to_float32(1.0 / s), s) for s in range(1, 21)]
    want += [(tag, to_float32(v), s) for s in (10, 20) for tag, v in
             (("Determined/val_loss", 0.5 / s), ("Determined/val_accuracy", s / 20))]
    assert sorted(read_scalars(stored)) == sorted(want)
    assert not local.exists()  # uploaded, then removed


@pytest.mark.integration
def test_manual_mode_writes_nothing_and_uploads_on_request(fake_master: Any, tmp_path: Path) -> None:
    import harness.core

    with harness.core.init(env=cluster_env(fake_master, tmp_path / "ckpts"),
                           tensorboard_mode=harness.core.TensorboardMode.MANUAL) as ctx:
        ctx.train.report_training_metrics(1, {"loss": 1.0})
        local = ctx.train.get_tensorboard_path()
        w = EventFileWriter(local / "mine")
        w.add_scalar("custom/loss", 2.0, 1)
        w.close()
        ctx.train.upload_tensorboard_files(mangler=lambda p, rank: p.with_name(p.name + f"#{rank}"))
    stored = tmp_path / "ckpts" / "cluster-1" / "tensorboard" / "experiment" / "3" / "trial" / "7"
    assert [p.relative_to(stored).as_posix() for p in stored.rglob("*tfevents*")] == [f"mine/{w.paths[0].name}#0"]
    assert read_scalars(stored) == [("custom/loss", 2.0, 1)]
