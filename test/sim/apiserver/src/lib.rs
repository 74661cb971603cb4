//! An in-memory Kubernetes API server: the FakeApi of unit tests and the sim's management plane.
