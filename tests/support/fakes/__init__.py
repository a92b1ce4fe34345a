"""Fakes shared by the unit tests: sinks and forwarding targets that record or refuse, documents and envelopes,
a disk that fills up. One place, so that a change of an interface is one change here."""
