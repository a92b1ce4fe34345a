"""``se-exporter consume``: read the forwarded documents back from Event Hubs (``main``), with its settings
(``settings``: the CLI builds its flags from them without importing the consumer)."""
