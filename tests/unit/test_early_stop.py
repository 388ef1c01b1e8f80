from types import SimpleNamespace

from psgd.callbacks import TargetAccuracyStop


def run_rule(accuracies, target, patience):
    """Epoch (1-based) after whose validation TargetAccuracyStop stops the fit, or None."""
    stop = TargetAccuracyStop(target, patience)
    for epoch, acc in enumerate(accuracies):
        metrics = {} if acc is None else {"val/acc": acc}
        trainer = SimpleNamespace(
            sanity_checking=False, state=SimpleNamespace(fn="fit"), callback_metrics=metrics, current_epoch=epoch
        )
        stop.on_validation_end(trainer, None)
        if getattr(trainer, "should_stop", False):
            assert stop.stopped_epoch == epoch
            return epoch + 1
    return None


def test_stops_after_patience_consecutive_epochs_at_target():
    assert run_rule([0.80, 0.86, 0.87, 0.90], target=0.85, patience=2) == 3


def test_a_dip_below_target_resets_the_count():
    assert run_rule([0.86, 0.84, 0.86, 0.85], target=0.85, patience=2) == 4
    assert run_rule([0.86, 0.84, 0.86, 0.84], target=0.85, patience=2) is None


def test_target_is_inclusive_and_patience_one_stops_at_first_hit():
    assert run_rule([0.5, 0.85], target=0.85, patience=1) == 2


def test_missing_accuracy_counts_as_not_reached():
    assert run_rule([0.9, None, 0.9], target=0.5, patience=2) is None
