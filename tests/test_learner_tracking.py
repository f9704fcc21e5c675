"""Experiment tracking, built from the run section alone: every number of a step row reaches
TensorBoard at its step, and every ``run.log_samples_every`` steps a table of decoded samples."""

from __future__ import annotations

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from streamrl.configs.schema import RunConfig
from streamrl.learner.batching import Sample
from streamrl.learner.prepare import Batch
from streamrl.learner.tracking import TENSORBOARD_DIR, Tracker
from streamrl.policy.load import load_tokenizer


def _batch(tokenizer, count: int) -> Batch:
    prompt = tokenizer.encode("123", add_special_tokens=False)
    completion = tokenizer.encode("321", add_special_tokens=False)
    samples = [
        Sample(
            input_ids=np.asarray(prompt + completion, dtype=np.int64),
            prompt_len=len(prompt),
            behaviour_logprobs=np.zeros(len(completion), dtype=np.float32),
            versions=np.zeros(len(completion), dtype=np.int64),
            advantage=0.5,
            reward=1.0,
            group_id=f"g{i}",
        )
        for i in range(count)
    ]
    return Batch(version=0, samples=samples, entries=[], log={})


def test_tensorboard_gets_each_number_of_the_step_rows_and_a_sample_table_every_n_steps(
    tmp_path, demo_policy
):
    run = RunConfig(
        dir=str(tmp_path), report_to=["tensorboard"], log_samples_every=2, log_samples=1
    )
    tracker = Tracker(run, demo_policy, hyperparameters={})
    batch = _batch(load_tokenizer(demo_policy), 3)
    for step in (1, 2):
        row = {"step": step, "time": 9.0, "reward_mean": step / 4, "reward_parts": {"exact": 1.0}}
        tracker.log(row, batch)
    tracker.close()

    events = EventAccumulator(str(tmp_path / TENSORBOARD_DIR), size_guidance={"tensors": 0})
    events.Reload()
    scalars = {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }
    assert scalars == {
        "reward_mean": [(1, 0.25), (2, 0.5)],
        "reward_parts/exact": [(1, 1.0), (2, 1.0)],
    }
    tables = events.Tensors("samples/text_summary")
    assert [t.step for t in tables] == [2]
    text = tables[0].tensor_proto.string_val[0].decode()
    # one row (run.log_samples), prompt and completion decoded apart
    assert text.count("| 123 | 321 |") == 1
