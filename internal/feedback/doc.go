// Package feedback forwards the feedback ingestion API (POST
// {feedback_url}/api/1/ai-feedback/ingest; docs/upstream-api.md,
// "Feedback") on the admin listener and holds
// the item rules and chunking the `relay feedback` command shares.
//
// # Rules checked locally
//
// The body is checked decoded by its Content-Encoding (forward.DecodedBody;
// undecodable: 400) and forwarded as sent.
//
//   - The body is at most MaxBytes (5 MB, read as 5,000,000 bytes): else 413.
//   - It is a JSON object with a non-empty string source_id and an items
//     array of 1 to MaxItems (100) items: else 400.
//   - Each item is an object; its conversation_parts, when present, an
//     array of objects, each with a non-empty string body and no
//     conversation_parts of its own (parts are not nested). A request with
//     a bad item is answered 400 as a whole, nothing sent, with the bad
//     items in the upstream's answer shape: {"error", "source": "relay",
//     "ingested": 0, "failed": N, "errors": [{"unique_id", "error"}]}.
//     (The upstream would ingest the good items and report the bad ones;
//     the relay does not rewrite bodies, so the caller resends the good
//     ones. The `relay feedback` command leaves bad items out itself.)
//
// Rules the document does not state (field types and lengths, which
// fields are required) are left to the upstream, whose per-item errors
// pass back untouched.
//
// # Credentials
//
// Project HTTP Basic: the caller's Authorization passes through, or
// X-Relay-Project names a project whose key pair the relay injects. The base
// is the project's feedback_url override, else the URL given to API
// (--feedback-url).
package feedback
