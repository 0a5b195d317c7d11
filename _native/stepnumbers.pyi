from collections.abc import Iterable, Mapping

from .stepnumbers_ref import Fields as Fields  # one definition, beside the twin

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
