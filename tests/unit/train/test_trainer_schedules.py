import math

import pytest
import torch

from attnlab.train import TransformerTrainer, warmup_cosine_schedule, warmup_cosine_scheduler


def test_known_values():
    schedule = lambda step: warmup_cosine_schedule(step, warmup_steps=100, total_steps=1100)  # noqa: E731
    assert schedule(0) == 0.0
    assert schedule(50) == pytest.approx(0.5)  # half-way up the warm-up
    assert schedule(100) == 1.0  # the peak
    assert schedule(600) == pytest.approx(0.5)  # cosine midpoint
    assert schedule(350) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert schedule(1100) == pytest.approx(0.0, abs=1e-12)  # the end of the real run
    assert schedule(5000) == pytest.approx(0.0, abs=1e-12)


def test_min_ratio_and_no_warmup():
    assert warmup_cosine_schedule(0, warmup_steps=0, total_steps=10) == 1.0
    assert warmup_cosine_schedule(10, warmup_steps=0, total_steps=10, min_ratio=0.1) == pytest.approx(0.1)


def test_scheduler_reaches_zero_at_the_real_total_not_100000():
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=2.0)
    scheduler = warmup_cosine_scheduler(optimizer, warmup_steps=4, total_steps=20)
    rates = []
    for _ in range(20):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert rates[4] == 2.0 and rates[12] == pytest.approx(1.0)
    assert scheduler.get_last_lr()[0] == pytest.approx(0.0, abs=1e-12)


def test_trainer_uses_articles_adam_defaults_and_real_total():
    model = torch.nn.Linear(2, 2)
    trainer = TransformerTrainer(model, total_steps=8000)
    group = trainer.optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9 and trainer.grad_clip == 1.0
    assert trainer.warmup_steps == 4000 and trainer.learning_rate == 5e-5
    assert trainer.scheduler.lr_lambdas[0](6000) == pytest.approx(0.5)


@pytest.mark.parametrize("bad", [dict(warmup_steps=-1, total_steps=5), dict(warmup_steps=1, total_steps=0)])
def test_bad_arguments(bad):
    with pytest.raises(ValueError):
        warmup_cosine_schedule(0, **bad)
