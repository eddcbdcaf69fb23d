"""What a run writes as it goes: per-member CSVs, the progress bar and the
summary (``logging``), and the experiment trackers of ``--track``
(``tracking``)."""
