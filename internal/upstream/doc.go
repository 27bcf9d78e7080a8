// Package upstream is the relay's HTTP client towards the upstream API. It
// sends one request body and CLASSIFIES the answer into a Result (its class
// and the fields of its body); it never retries, waits or drops anything
// itself. What a Result means (retry after, pause devices or users, split,
// dead-letter, stop a lane) is decided in one place, internal/delivery's
// answer rule, as in Prometheus remote write, where the client classifies
// and the queue decides.
//
// Classification (Classify) looks at the HTTP status first and at the body's
// "code" only when the status says nothing known; bodies that are not JSON
// are tolerated (the status alone then decides). See Kind for every class.
// The classifier is path-agnostic: the same Client and Classify serve
// /2/httpapi, /groupidentify and /usermap.
//
// Every Result keeps the raw answer (status line and a truncated body) for the
// dead-letter store.
//
// Goroutines: Do runs the request on its own goroutine so that a caller whose
// context ends can abandon it; the abandoned request finishes (or times out)
// by itself and touches nothing of the caller's. A Client is safe for
// concurrent use.
package upstream
