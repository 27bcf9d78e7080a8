// Package credentials loads the relay's --credentials file: the upstream
// credentials of projects and organizations that the admin listener injects
// when a caller names a project with X-Relay-Project (see the contract's
// "Admin listener" section).
//
// File shape (YAML; unknown keys are an error so typos are caught at start):
//
//	projects:
//	  - name: web-prod          # what X-Relay-Project names
//	    api_key: "..."
//	    secret_key: "..."
//	    analytics_url: "..."    # optional: ingest_url, alias_url, analytics_url,
//	                            # experiment_url, scim_url, feedback_url
//	    tracking_plan: block    # optional: off, observe, filter or block
//	                            # (internal/plan); default --tracking-plan
//	organizations:
//	  - name: acme
//	    api_key: "..."          # organization key pair (DSAR)
//	    secret_key: "..."
//	    management_api_key: "..." # optional: experiment management
//	    scim_token: "..."         # optional: SCIM provisioning
//	    projects: [web-prod]
//	    # optional *_url keys as for projects
//
// Invariants:
//   - A *Store returned without error is valid and immutable: names (1 to
//     MaxNameLen of [A-Za-z0-9._-]) are unique among projects and among
//     organizations; every project has a non-empty api_key and secret_key,
//     and api keys are unique; every organization has a non-empty api_key and
//     secret_key; each project is listed by at most one organization, and
//     every name an organization lists is a project of the file; every
//     upstream base is an absolute http(s) URL without user info, query or
//     fragment.
//   - Upstream base of a project: its own *_url, else its organization's,
//     else the --*-url flag (Project.URL).
//   - Secrets never leave through formatting: Secret prints as Redacted in
//     fmt (every verb), JSON, text, zap and slog, so *Project and
//     *Organization print their Secrets redacted too; *Store formats
//     and logs its names only. Only Secret.Reveal,
//     BasicAuth and Bearer return the value, for the wire. Errors of Load and
//     Parse name keys and lines but never a value (yaml's own messages are
//     rewritten to hide the scalar they quote). A Secret keeps its value
//     behind a pointer and the api_key index is keyed by a SHA-256 of the
//     key, so even fmt's raw printing of unexported fields shows no secret.
//   - A nil *Store means no credentials file: every lookup reports false.
package credentials
