"""The champion/challenger decision (pure)."""

from __future__ import annotations

from models.registry import Score, beats


def test_a_candidate_replaces_the_champion_only_when_strictly_better() -> None:
    champion = Score(f1=0.90, pr_auc=0.95)
    assert beats(Score(0.91, 0.80), champion)  # F1 first
    assert beats(Score(0.90, 0.96), champion)  # then PR-AUC
    assert not beats(Score(0.90, 0.95), champion)  # a tie keeps the champion
    assert not beats(Score(0.89, 0.99), champion)
    assert beats(Score(0.0, 0.0), None)  # no champion yet
