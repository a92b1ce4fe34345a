"""The Azure helpers every Event Hubs user shares (the sidecar's forwarding, ``consume``, ``fleet``): the credential,
and the SDK decoder workaround (``amqp_types``)."""
