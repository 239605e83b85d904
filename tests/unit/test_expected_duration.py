"""`croqq up` states how long a submission should take before it has a measured rate."""

from croqq.settings import Settings
from croqq.work.progress import CPU_S_PER_ITERATION, expected_s


def test_a_zero_time_simulation_is_priced_by_its_cpu_over_the_machines_cores() -> None:
    settings = Settings(backend="sim", proposer="agent", agent="scripted")
    assert expected_s(settings, 1000, gpus=8, cores=2) == 1000 * CPU_S_PER_ITERATION / 2


def test_a_slow_simulated_gpu_is_priced_by_its_measurements_spread_over_the_gpus() -> None:
    settings = Settings(backend="sim", proposer="search", time_scale=1.0, sim_measure_s=10.0)
    assert expected_s(settings, 80, gpus=8, candidates=2, cores=2) == 80 * 10.0 * 2 / 8


def test_no_estimate_where_the_step_times_are_unknown_beforehand() -> None:
    assert expected_s(Settings(backend="sim", proposer="agent", agent="claude"), 100, gpus=8) is None
