"""Tables and figures: pure functions of saved results. Each paper has its package (``pflkit.report.<paper>``:
its title, stand-ins, kept states, claims, tables and figures), listed in `pflkit.report.papers`."""
from pflkit.report.tables import format_table, results_table

__all__ = ["format_table", "results_table"]
