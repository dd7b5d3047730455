"""The reference workload's state parts and their buggy twins, trained in-process (torch,
no Ray): a correct restore follows the fault-free trajectory bit for bit; a restore that
forgets one part differs in exactly that part's digest at the first step after it, and its
loss leaves the trajectory beyond the default tolerance within a few steps."""

import io

import pytest

from chaos.verdicts.states import DIGEST_PARTS
from chaos.verdicts.tolerance import STATE_ATOL, STATE_RTOL

torch = pytest.importorskip("torch")
from chaos.train.workloads.reference import PARTS, TrainState  # noqa: E402

STEPS, CHECKPOINT = 20, 10


def train(state: TrainState, steps) -> dict[int, tuple[float, dict]]:
    """Rank 0's step as the workload's loop takes it: (loss, digests the step began from)."""
    out = {}
    for step in steps:
        began = state.digests()
        x, y = state.batch(0)
        loss = torch.nn.functional.mse_loss(state.model(x), y)
        state.optimizer.zero_grad()
        loss.backward()
        state.optimizer.step()
        state.advance()
        out[step] = (float(loss.item()), began)
    return out


def resumed(forget: tuple[str, ...]) -> dict[int, tuple[float, dict]]:
    """Train to the checkpoint, save it through torch.save as the workload does, and go on in
    a fresh state restored from it (but ``forget``)."""
    first = TrainState(0, 2, STEPS)
    train(first, range(1, CHECKPOINT + 1))
    buffer = io.BytesIO()
    torch.save(first.to_checkpoint(CHECKPOINT), buffer)
    buffer.seek(0)
    again = TrainState(0, 2, STEPS)
    start = again.restore(torch.load(buffer, weights_only=True), forget)
    assert start == CHECKPOINT
    return train(again, range(start + 1, STEPS + 1))


@pytest.fixture(scope="module")
def baseline():
    return train(TrainState(0, 2, STEPS), range(1, STEPS + 1))


def test_the_verdict_names_the_parts_the_workload_reports():
    assert PARTS == DIGEST_PARTS


def test_a_correct_restore_follows_the_fault_free_trajectory_exactly(baseline):
    after = resumed(())
    assert {s: after[s] for s in after} == {s: baseline[s] for s in after}


@pytest.mark.parametrize("part", PARTS)
def test_each_forgotten_part_shows_in_its_own_digest_and_in_the_loss(baseline, part):
    after = resumed((part,))
    first = CHECKPOINT + 1
    differ = [k for k in baseline[first][1] if baseline[first][1][k] != after[first][1][k]]
    assert differ == [f"digest_{part}"]
    left = [s for s in after if abs(after[s][0] - baseline[s][0]) > STATE_ATOL + STATE_RTOL * abs(baseline[s][0])]
    assert left and left[0] <= first + 2, (part, left)



@pytest.mark.parametrize("forget", [(), *((p,) for p in PARTS)], ids=["restored", *PARTS])
def test_the_checkpoints_saved_digests_are_what_the_step_after_a_restore_begins_from(forget):
    """The workload reports, with each checkpoint, the digests of the state it saved
    (``saved_digest_<part>``): the first step after a correct restore begins from exactly
    that state — the whole of it shown with no step re-done — and a forgotten part differs."""
    first = TrainState(0, 2, STEPS)
    train(first, range(1, CHECKPOINT + 1))
    saved = first.digests()  # what the loop reports as saved_digest_<part> with checkpoint 10
    began = resumed(forget)[CHECKPOINT + 1][1]
    assert [k for k in saved if saved[k] != began[k]] == [f"digest_{p}" for p in forget]
