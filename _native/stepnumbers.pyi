from collections.abc import Iterable, Mapping

# the fields of denpex.series.parse.StepNumbers, in its order: format, step, total_steps, epoch,
# loss, grad_norm, loss_scale, lr, step_time_s, throughput, throughput_unit, skipped,
# skipped_total, rank
Fields = tuple[
    str,
    int | None,
    int | None,
    float | None,
    float | None,
    float | None,
    float | None,
    float | None,
    float | None,
    float | None,
    str | None,
    int | None,
    int | None,
    int | None,
]

class StepParser:
    parse_limit: int
    fallbacks: int
    def __init__(
        self,
        loss_keys: Iterable[str],
        grad_norm_keys: Iterable[str],
        loss_scale_keys: Iterable[str],
        lr_keys: Iterable[str],
        step_keys: Iterable[str],
        step_time_keys: Mapping[str, float],
        throughput_keys: Mapping[str, str],
        unit_seconds: Mapping[str, float],
        summary_keys: Iterable[str],
        parse_limit: int,
    ) -> None: ...
    def parse(self, line: bytes) -> Fields | None: ...
