//! Who is calling: set by the layer that authenticates a request, read by whatever
//! scopes its records to the caller (Idempotency-Keys).

/// Who is calling. An authentication layer that knows the caller inserts this into the
/// request's extensions, and keys are then scoped to it: two callers may use the same key
/// without meeting. Without it, every request is the anonymous caller (scope `""`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Caller(pub String);
