"""wtune.Trainable: one sandboxed trial driven from Python, on the real
sandbox and the repository's guest components."""

from __future__ import annotations

import shutil
import threading
import time
import unicodedata
from pathlib import Path

import pytest

import wtune
from wtune._cuda import pci_address
from conftest import DIGITS, DIGITS_CONFIG

WALK = {"seed": 7, "buffer_kib": 64, "iterations": 50}
LIMITS = {"memory": "64MiB", "fuel_per_call": "1e9", "call_timeout": "20s"}


def digests(trainable: wtune.Trainable, n: int) -> list[float]:
    return [trainable.train()["digest"] for _ in range(n)]


def test_a_restored_snapshot_continues_bit_identically(stateful):
    straight = wtune.Trainable(stateful, WALK, limits=LIMITS)
    expected = digests(straight, 6)

    first = wtune.Trainable(stateful, WALK, limits=LIMITS)
    assert digests(first, 3) == expected[:3]
    checkpoint = first.save()
    assert isinstance(checkpoint, bytes) and checkpoint
    first.close()

    # Another instance, from the bytes alone: the counts and the memory go on.
    resumed = wtune.Trainable(stateful.read_bytes(), WALK, limits=LIMITS, restore=checkpoint)
    assert resumed.iteration == 3
    report = resumed.train()
    assert report["training_iteration"] == 4
    assert [report["digest"]] + digests(resumed, 2) == expected[3:]
    assert resumed.checkpoint_mode == "snapshot"


def test_restore_rewinds_a_live_trial_and_reports_counts(stateful, tmp_path):
    trainable = wtune.Trainable(stateful, WALK, limits=LIMITS, trial_dir=tmp_path / "trial")
    first = trainable.train()
    assert first["training_iteration"] == 1 and first["done"] is False
    assert first["fuel_this_iter"] > 0 and first["fuel_total"] >= first["fuel_this_iter"]
    assert first["time_total_s"] == pytest.approx(first["time_this_iter_s"])
    path = tmp_path / "one.wtsnap"
    size = trainable.save(path)
    assert size == path.stat().st_size
    second = trainable.train()["digest"]
    trainable.train()
    trainable.restore(path)
    assert trainable.iteration == 1
    assert trainable.fuel_total == first["fuel_total"]
    assert trainable.train()["digest"] == second
    assert (tmp_path / "trial" / "work").is_dir()


def test_guest_checkpoints_use_the_guests_save(hostile):
    trainable = wtune.Trainable(hostile, {"iterations": 10}, checkpoint="guest")
    assert trainable.checkpoint_mode == "guest"
    trainable.train()
    trainable.train()
    checkpoint = trainable.save()
    resumed = wtune.Trainable(hostile, {"iterations": 10}, checkpoint="guest", restore=checkpoint)
    assert resumed.train()["score"] == 3.0


def test_a_restore_without_a_config_goes_on_with_the_checkpoints(stateful):
    first = wtune.Trainable(stateful, WALK, limits=LIMITS)
    first.train()
    checkpoint = first.save()
    expected = first.train()["digest"]
    resumed = wtune.Trainable(stateful, limits=LIMITS, restore=checkpoint)
    assert resumed.config == WALK
    assert resumed.train()["digest"] == expected
    # The checkpoint's last result and clock go on too: a save straight
    # after the restore describes the same trial.
    again = wtune.Trainable(stateful, limits=LIMITS, restore=resumed.save())
    assert again.iteration == 2 and again.config == WALK


def test_a_deferred_setup_runs_at_the_first_call_or_never_when_restored(hostile, tmp_path):
    benign = wtune.Trainable(hostile, {"iterations": 10}, checkpoint="guest")
    benign.train()
    checkpoint = tmp_path / "benign.wtsnap"
    benign.save(checkpoint)
    # A setup that would hang past the deadline: a deferred trainable
    # compiles without running it...
    hanging = {"attack": "sleep_setup", "iterations": 10}
    limits = {**LIMITS, "call_timeout": "1s"}

    def deferred() -> wtune.Trainable:
        return wtune.Trainable.from_settings(
            hostile, hanging, {"limits": limits, "checkpoint": "guest"}, ".", deferred=True
        )

    recovered = deferred()
    assert recovered.iteration == 0
    # ...and a restore first (a Ray trial recovered on another node) never
    # runs it: the checkpoint's trial goes on.
    recovered.restore(checkpoint)
    assert recovered.config == {"iterations": 10}
    assert recovered.train()["score"] == 2.0
    # Without a restore, the first call runs setup and raises its failure;
    # nothing changed, so the next call tries again.
    fresh = deferred()
    for _ in range(2):
        with pytest.raises(wtune.DeadlineExceeded, match="setup"):
            fresh.train()
        assert fresh.iteration == 0
    # A deferred restart closes the old instance and sets up the next
    # one when it is first needed.
    benign.restart({"iterations": 10, "attack": "error", "at": 1}, deferred=True)
    assert benign.iteration == 0
    with pytest.raises(wtune.GuestError, match="deliberate failure at iteration 1"):
        benign.train()


# attack -> (exception, words its message must hold, extra limits)
FAILURES = {
    "panic": (wtune.GuestTrap, ["train() at iteration 1 panicked", "hostile guest panicked on purpose"], {}),
    "trap": (wtune.GuestTrap, ["train() at iteration 1 trapped"], {}),
    "exit": (wtune.GuestTrap, ["called exit"], {}),
    "error": (wtune.GuestError, ["deliberate failure at iteration 1"], {}),
    "memory_bomb": (wtune.MemoryExceeded, ["memory limit 64 MiB exceeded"], {}),
    "loop_train": (wtune.FuelExhausted, ["exceeded the per-call fuel limit of 1e9"], {}),
    "sleep_train": (wtune.DeadlineExceeded, ["train() at iteration 1 exceeded its 1s deadline"], {"call_timeout": "1s"}),
    "reserved_metric": (wtune.BadOutput, ["training_iteration"], {}),
    # Terminal escapes and a forged line, shown as visible escapes.
    "terminal": (wtune.GuestError, ["\\u{1b}]0;pwned\\u{7}", "\\r\\nBest trial: trial_9999"], {}),
}


@pytest.mark.parametrize("attack", sorted(FAILURES))
def test_a_failing_guest_raises_its_family_with_the_reason(hostile, attack):
    exception, words, limits = FAILURES[attack]
    trainable = wtune.Trainable(hostile, {"attack": attack}, limits={**LIMITS, **limits})
    with pytest.raises(exception) as raised:
        trainable.train()
    assert isinstance(raised.value, wtune.TrialError)
    message = str(raised.value)
    for word in words:
        assert word in message
    # Ray and loggers print the message to an operator's terminal.
    assert not [c for c in message if unicodedata.category(c) == "Cc"], message


def test_a_spent_fuel_budget_is_fuel(hostile):
    trainable = wtune.Trainable(hostile, {"attack": "loop_train"}, limits={"fuel_per_trial": "5e7"})
    with pytest.raises(wtune.FuelExhausted, match="fuel budget 5e7 exhausted"):
        trainable.train()


def test_a_trapped_trial_can_be_restored_from_its_last_checkpoint(hostile):
    trainable = wtune.Trainable(hostile, {"attack": "trap", "at": 3}, limits=LIMITS)
    trainable.train()
    checkpoint = trainable.save()
    trainable.train()
    with pytest.raises(wtune.GuestTrap):
        trainable.train()
    with pytest.raises(wtune.WtuneError, match="trapped earlier"):
        trainable.train()
    trainable.restore(checkpoint)
    assert trainable.train()["score"] == 2.0


def test_bad_input_gets_a_clear_error(stateful, hostile, tmp_path):
    with pytest.raises(wtune.ComponentError, match="no-such.wasm"):
        wtune.Trainable(tmp_path / "no-such.wasm", WALK)
    text = tmp_path / "model.wasm"
    text.write_text("not a component")
    with pytest.raises(wtune.ComponentError, match="not a WebAssembly binary"):
        wtune.Trainable(text, WALK)
    with pytest.raises(wtune.GuestError, match="setup"):
        wtune.Trainable(hostile, {"attack": "no-such-attack"})
    with pytest.raises(wtune.ConfigError, match=r"limits: unknown field `memroy`"):
        wtune.Trainable(stateful, WALK, limits={"memroy": "1GiB"})
    with pytest.raises(wtune.ConfigError, match="limits.memory"):
        wtune.Trainable(stateful, WALK, limits={"memory": "lots"})
    with pytest.raises(wtune.ConfigError, match="config must be JSON"):
        wtune.Trainable(stateful, {"seed": object()})
    with pytest.raises(wtune.ConfigError, match="checkpoint"):
        wtune.Trainable(stateful, WALK, checkpoint="sometimes")
    with pytest.raises(wtune.ConfigError, match="cannot read config"):
        wtune.Trainable(stateful, WALK, experiment=tmp_path / "missing.toml")


def test_a_bad_checkpoint_is_refused_and_loses_nothing(stateful):
    trainable = wtune.Trainable(stateful, WALK, limits=LIMITS)
    trainable.train()
    with pytest.raises(wtune.CheckpointError):
        trainable.restore(b"not a checkpoint")
    other = wtune.Trainable(stateful, {**WALK, "seed": 8}, limits=LIMITS)
    assert other.train()["digest"] != 0
    # The live trial is untouched by the refused restore.
    assert trainable.train()["training_iteration"] == 2


def test_reset_keeps_what_was_learned_and_restart_starts_over(digits):
    trainable = wtune.Trainable(digits, DIGITS_CONFIG, experiment=DIGITS / "experiment.toml")
    trainable.train()
    assert trainable.reset({**DIGITS_CONFIG, "lr": 0.2}) is True
    assert trainable.config["lr"] == 0.2
    assert trainable.train()["training_iteration"] == 2
    # A wider network cannot keep the weights: the guest says no.
    assert trainable.reset({**DIGITS_CONFIG, "hidden": 64}) is False
    assert trainable.config["hidden"] == 32
    trainable.restart({**DIGITS_CONFIG, "hidden": 64})
    assert trainable.iteration == 0
    assert trainable.train()["training_iteration"] == 1


def test_restart_into_a_new_trial_directory_leaves_the_old_trial_s_files(hostile, tmp_path):
    probe = {"attack": "probe", "iterations": 1}
    trainable = wtune.Trainable(hostile, probe, trial_dir=tmp_path / "a", trial_id="a")
    assert trainable.train()["cwd_entries"] == 0
    assert (tmp_path / "a" / "work" / "probe.txt").exists()
    # A new trial on the same compiled component (a reused Ray actor):
    # its guest sees a directory of its own, not the last trial's file.
    trainable.restart(probe, trial_dir=tmp_path / "b", trial_id="b")
    assert trainable.trial_dir == tmp_path / "b"
    assert trainable.train()["cwd_entries"] == 0
    assert (tmp_path / "b" / "work" / "probe.txt").exists()
    # Without a directory, the restart stays where it was.
    trainable.restart(probe)
    assert trainable.trial_dir == tmp_path / "b"
    assert trainable.train()["cwd_entries"] == 1
    # A trial given no directory has one made for it, kept while a new
    # trial's files go inside it.
    scratch = wtune.Trainable(hostile, probe)
    made = scratch.trial_dir
    scratch.restart(probe, trial_dir=made / "next")
    assert scratch.train()["cwd_entries"] == 0
    assert (made / "next" / "work" / "probe.txt").exists()


def test_an_experiment_file_gives_its_limits_and_data(digits, tmp_path):
    # digits-mlp reads its data from the file's [data] grant.
    with wtune.Trainable(digits, DIGITS_CONFIG, experiment=DIGITS / "experiment.toml") as t:
        report = t.train()
    assert 0.5 < report["val_accuracy"] <= 1.0
    # Keyword arguments go over the file's.
    tight = wtune.Trainable(
        digits, DIGITS_CONFIG, experiment=DIGITS / "experiment.toml", limits={"fuel_per_trial": "1e8"}
    )
    with pytest.raises(wtune.FuelExhausted, match="fuel budget 1e8 exhausted during train"):
        tight.train()


def test_guest_output_goes_to_the_trial_logs_not_the_terminal(stateful, tmp_path, capfd):
    trainable = wtune.Trainable(stateful, {**WALK, "print": True}, trial_dir=tmp_path)
    trainable.train()
    trainable.close()
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert (tmp_path / "stdout.log").read_text().strip()


def test_trials_train_in_parallel_threads(stateful):
    straight = digests(wtune.Trainable(stateful, WALK, limits=LIMITS), 20)
    results: dict[int, list[float]] = {}

    def run(i: int) -> None:
        results[i] = digests(wtune.Trainable(stateful, WALK, limits=LIMITS), 20)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(results[i] == straight for i in range(4))


def test_reading_a_trial_during_its_step_leaves_other_threads_running(hostile):
    """A getter waits for a step in progress on another thread without
    holding the GIL, so the interpreter's other threads (and Ctrl-C) go on
    meanwhile. Holding it, this thread's short sleep would last until the
    step's 5 s deadline."""
    trainable = wtune.Trainable(
        hostile, {"attack": "sleep_train"}, limits={**LIMITS, "call_timeout": "5s"}
    )
    seen: dict[str, object] = {}
    stepping = threading.Event()

    def train() -> None:
        stepping.set()
        try:
            trainable.train()
        except wtune.TrialError as e:
            seen["raised"] = type(e)

    def read() -> None:
        seen["iteration"] = trainable.iteration
        seen["fuel_total"] = trainable.fuel_total
        seen["config"] = trainable.config

    trainer = threading.Thread(target=train)
    trainer.start()
    stepping.wait()
    time.sleep(0.5)  # the step holds the trial now
    reader = threading.Thread(target=read)
    reader.start()
    started = time.monotonic()
    time.sleep(0.1)
    waited = time.monotonic() - started
    assert trainer.is_alive() and reader.is_alive()
    assert waited < 2.5, f"this thread stalled {waited:.1f} s behind a getter"
    trainer.join()
    reader.join()
    assert seen["raised"] is wtune.DeadlineExceeded
    assert seen["iteration"] == 0 and isinstance(seen["fuel_total"], int)
    assert seen["config"] == {"attack": "sleep_train"}


TRAP_AFTER_FAULTHANDLER = """
import faulthandler, sys
import wtune
hostile = sys.argv[1]
wtune.Trainable(hostile, {"attack": "trap"})  # the sandbox's engine exists
faulthandler.disable()
faulthandler.enable()  # signal handlers installed over wasmtime's
try:
    wtune.Trainable(hostile, {"attack": "trap"}).train()
except wtune.GuestTrap as e:
    print("trapped:", e)
"""


def test_a_trap_stays_a_trap_after_another_library_takes_the_signals(hostile):
    # Ray's ray.init() and faulthandler install signal handlers that do not
    # know wasm; without wtune putting its handlers back, the guest's trap
    # would kill the process (SIGILL).
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", TRAP_AFTER_FAULTHANDLER, str(hostile)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "trapped: train() at iteration 1 trapped" in run.stdout


def test_host_compute_runs_in_a_gpu_worker_the_package_starts(digits):
    # compute = "gpu" runs the guest's kernels in a GPU worker process
    # (software Vulkan where the machine has no GPU); inside Python that
    # worker is this package's native module run by this interpreter.
    config = {**DIGITS_CONFIG, "math": "host"}
    reports = {}
    for compute in ("cpu", "gpu"):
        trial = wtune.Trainable(digits, config, experiment=DIGITS / "experiment.toml", compute=compute)
        reports[compute] = [trial.train() for _ in range(2)][-1]
        trial.close()
    assert reports["gpu"]["val_loss"] == pytest.approx(reports["cpu"]["val_loss"], rel=1e-3)
    assert reports["gpu"]["fuel_total"] > 0


def test_a_trial_runs_on_the_gpu_it_is_given_or_is_refused(digits, stateful):
    # By number among host compute's GPUs (software Vulkan alone, where the
    # machine has no GPU).
    config = {**DIGITS_CONFIG, "math": "host"}
    settings = {"experiment": DIGITS / "experiment.toml", "compute": "gpu"}
    trial = wtune.Trainable(digits, config, gpu=0, **settings)
    assert trial.gpu == 0
    assert trial.train()["training_iteration"] == 1
    trial.close()
    # A GPU that is not there is refused before anything runs, with the
    # GPUs that are.
    for gpu, words in [
        (99, "GPU 99 is not one host compute runs on; it has GPU 0: "),
        ("0000:ff:1f.7", "the GPU at PCI address 0000:ff:1f.7 is not one host compute runs on"),
        ("gpu0", "is not a PCI address"),
    ]:
        with pytest.raises(wtune.ConfigError, match="gpu: ") as refused:
            wtune.Trainable(digits, config, gpu=gpu, **settings)
        assert words in str(refused.value)
    with pytest.raises(wtune.ConfigError, match="runs on no GPU here"):
        wtune.Trainable(digits, config, gpu=0, experiment=DIGITS / "experiment.toml", compute="cpu")
    # A component that does not import host compute runs nothing on a GPU.
    assert wtune.Trainable(stateful, WALK, gpu=3).gpu is None


def test_a_cuda_device_is_named_to_host_compute_by_its_pci_address(digits):
    # What a Ray trial given CUDA device 0 does: Vulkan numbers GPUs its own
    # way, so the device goes to host compute as its PCI address.
    if shutil.which("nvidia-smi") is None:
        with pytest.raises(wtune.ConfigError, match="nvidia-smi cannot say which device that is"):
            pci_address(0)
        return
    address = pci_address(0)
    config = {**DIGITS_CONFIG, "math": "host"}
    trial = wtune.Trainable(digits, config, experiment=DIGITS / "experiment.toml", compute="gpu", gpu=address)
    assert isinstance(trial.gpu, int)
    assert trial.train()["training_iteration"] == 1
    trial.close()
    with pytest.raises(wtune.ConfigError, match="nvidia-smi does not list it"):
        pci_address(99)
