"""Silent data corruption with real ranks: one bit flip, the loss-spike detector, rollback
(2 real MPI engines with Horovod; nothing is mocked; hpclab issue 15's acceptance)."""

import pytest

from hpclab import RunConfig

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

BASE = RunConfig(epochs=2, eval_samples=1024, publish_every_s=0.5)
FLIP = dict(sdc_layer=0, sdc_rank=1, sdc_step=40)  # the first conv's kernel, on rank 1
# Final accuracy of two 2-epoch runs that differ only by seed or rounding: within this of each
# other (seeds 0-2 here and flips of bit 0 on two machines moved it 0.2-3.1 points); a flip
# that harms training costs tens of points or diverges.
NOISE_FLOOR = 0.05


def _summary(lab, cfg):
    run = lab.run(cfg)
    summary = run.wait(timeout=600, check=False)  # (a diverged run is an outcome under test)
    return run.status, summary


def test_an_exponent_flip_in_one_ranks_weights_splits_the_replicas_and_rollback_heals_them(lab):
    """Bit 30 of a conv weight on rank 1: the replicas' digests differ right after the flip,
    the detector fires within 2 steps, and rollback restores equal replicas that finish."""
    status, s = _summary(
        lab, BASE.replace(sdc_target="weights", sdc_bit=30, spike_factor=3.0, rollback=True, **FLIP)
    )
    sdc = s["sdc"]
    print(f"[sdc] {sdc}")
    assert status == "finished"
    first, second = sdc["digest_after"]
    assert first != second  # rank 1's weights changed, rank 0's did not
    assert abs(sdc["after"]) > 1e30 and abs(sdc["before"]) < 10  # exponent bit: ~2^128 larger
    assert 0 <= sdc["detected_step"] - FLIP["sdc_step"] <= 2
    assert len(sdc["spikes"]) == 1
    assert sdc["spikes"][0]["restored_step"] < sdc["detected_step"]
    assert len(set(s["weights_digest"])) == 1  # equal replicas again
    assert s["val_accuracy"] > 0.8


def test_without_rollback_the_same_flip_ends_the_run_and_says_why(lab):
    status, s = _summary(
        lab, BASE.replace(sdc_target="weights", sdc_bit=30, spike_factor=3.0, **FLIP)
    )
    assert status == "diverged" and "NaN or infinite" in s["error"]
    assert 0 <= s["sdc"]["detected_step"] - FLIP["sdc_step"] <= 2
    assert s["sdc"]["spikes"] and "restored_step" not in s["sdc"]["spikes"][0]


def test_a_low_mantissa_flip_is_silent_splits_the_replicas_and_moves_accuracy_like_a_seed(lab):
    """Bit 0 moves one weight by one unit in the last place. Training is chaotic: that
    perturbation, like another seed or another CPU's rounding, moves the final accuracy by a
    point or a few (3.1 points measured on one machine, 0.2 on another), so the claim is judged
    against the spread between two seeds: the flip is silent and no worse than seed noise
    (twice the seeds' difference, and at least the NOISE_FLOOR a 2-epoch run shows).

    Right after the flip the replicas differ (their digests); whether they still differ at the
    end depends on rounding: a later update larger than the weight's last place can round both
    replicas to the same float (seen on one machine, not on another), so the end is printed,
    not asserted."""
    _, clean = _summary(lab, BASE)
    _, other_seed = _summary(lab, BASE.replace(seed=1))
    status, s = _summary(
        lab, BASE.replace(sdc_target="weights", sdc_bit=0, spike_factor=3.0, **FLIP)
    )
    seeds = abs(other_seed["val_accuracy"] - clean["val_accuracy"])
    moved = abs(s["val_accuracy"] - clean["val_accuracy"])
    print(f"[sdc] bit 0 moved accuracy {moved:.4f}; seed 0 vs 1: {seeds:.4f}")
    assert status == "finished" and s["sdc"]["detected_step"] is None
    assert moved <= max(2 * seeds, NOISE_FLOOR), (moved, seeds)
    assert len(set(s["sdc"]["digest_after"])) == 2, s["sdc"]  # one weight, one ulp apart
    assert len(set(clean["weights_digest"])) == 1
    print(f"[sdc] replicas at the end: {len(set(s['weights_digest']))} distinct digests")


def test_a_gradient_flip_reaches_every_rank_through_the_allreduce(lab):
    status, s = _summary(
        lab,
        BASE.replace(sdc_target="gradients", sdc_bit=30, spike_factor=3.0, rollback=True, **FLIP),
    )
    sdc = s["sdc"]
    assert status == "finished"
    assert len(set(sdc["digest_after"])) == 1  # the averaged gradient is the same everywhere
    assert 0 <= sdc["detected_step"] - FLIP["sdc_step"] <= 2
    assert len(set(s["weights_digest"])) == 1


def test_the_detector_stays_quiet_on_a_clean_run(lab):
    status, s = _summary(lab, BASE.replace(spike_factor=3.0, rollback=True, epochs=3))
    assert status == "finished" and s["sdc"]["detected_step"] is None and not s["sdc"]["spikes"]
