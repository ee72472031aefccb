"""tether.report: self-contained HTML run reports and run comparisons."""
