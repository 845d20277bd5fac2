"""Tables and figures: pure functions of saved results."""
from pflkit.report.tables import format_table, results_table

__all__ = ["format_table", "results_table"]
