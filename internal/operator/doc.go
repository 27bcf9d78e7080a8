// Package operator holds the operator commands of `relay` that move data
// through the upstream's APIs by hand: export, dsar, delete-users,
// feedback, backfill and migrate (the last two are internal/backfill's
// flags and progress: backfill.go), all run by
//
//	Main(ctx context.Context, name string, args []string, stdout, stderr io.Writer) int
//
// which parses the command's flags (args excludes the subcommand name) and
// returns the exit code: 0 done, 1 failed (the reason on stderr; export and
// dsar can be run again to resume), 2 usage. cmd/relay only dispatches.
// Each command is a function that registers its own flags and returns its
// work (the commands table); the flow around the work (parsing, exit codes,
// the error line) is Run's, which relay's other subcommands share.
//
// # Upstream and credentials
//
// The commands talk to the upstream directly (not through a running
// relay): the base is the project's (or its organization's) override in
// --credentials, else --analytics-url / --feedback-url. Credentials come
// from the --credentials file (the relay's own format): --project names the
// project (export, deletion, feedback: its api_key:secret_key as HTTP
// Basic; dsar: its organization's key pair, or --org names the
// organization). Secrets are never printed.
//
// # Output
//
// Results go to stdout (one line per item of interest); progress and
// errors to stderr. When stderr is a terminal, progress is one updating
// line (carriage return, at most 10 redraws a second); otherwise it is
// plain log lines, one per step.
//
// # Retries
//
// 429, 5xx and transport errors are retried with exponential backoff and
// jitter (github.com/cenkalti/backoff/v4; Retry-After honoured, capped at
// --retry-max), until --retry-time has passed; other answers are final.
// The one request that must not reach the upstream twice, DSAR create, is
// retried only on 429 and 503 answers, never after a transport error. An
// export archive cut mid-body is fetched again (up to 5 tries).
// Client-side pacing follows the documents: deletion POSTs at most 1 per
// second; DSAR polls back off from --poll-initial to --poll-max, far under
// the 14400-per-hour cost budget.
package operator
