// Package forms holds what the admin listener's form-request routes
// (POST /groupidentify in internal/groupidentify, POST /usermap and GET
// /api/2/usermap in internal/usermap) share: Handler (the form read, the
// items checked by Each), the ValidationError of a request refused
// locally, and the Intake that accepts records and answers refusals as
// {"code":STATUS,"error":"..."}.
//
// Invariants:
//   - Every refusal an Intake writes is counted once in its
//     relay_<name>_rejected_requests_total, labelled by the
//     ValidationError's Reason.
//   - A spool failure (SpoolFailed) is 503 with Retry-After; only an
//     unexpected error (not spool.ErrFull, ErrDiskLow or ErrClosed) is
//     logged, with its error and never a request's api_key.
//
// It has no package-level state.
package forms
