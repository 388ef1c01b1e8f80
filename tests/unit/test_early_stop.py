from psgd.callbacks import update_streak


def run_rule(accuracies, target, patience):
    """Epoch (1-based) at which the rule stops, or None."""
    streak = 0
    for epoch, acc in enumerate(accuracies, start=1):
        streak = update_streak(streak, acc, target)
        if streak >= patience:
            return epoch
    return None


def test_stops_after_patience_consecutive_epochs_at_target():
    assert run_rule([0.80, 0.86, 0.87, 0.90], target=0.85, patience=2) == 3


def test_a_dip_below_target_resets_the_count():
    assert run_rule([0.86, 0.84, 0.86, 0.85], target=0.85, patience=2) == 4
    assert run_rule([0.86, 0.84, 0.86, 0.84], target=0.85, patience=2) is None


def test_target_is_inclusive_and_patience_one_stops_at_first_hit():
    assert run_rule([0.5, 0.85], target=0.85, patience=1) == 2


def test_missing_accuracy_counts_as_not_reached():
    assert update_streak(3, None, 0.5) == 0
