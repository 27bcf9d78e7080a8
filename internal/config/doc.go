// Package config loads the relay's settings from command-line flags,
// RELAY_* environment variables and a YAML file, in that order of precedence
// (a flag beats the variable, the variable beats the file, the file beats
// the default), and validates them.
//
// Names are fixed by the relay's contract: flag --ingest-url is variable
// RELAY_INGEST_URL and YAML key ingest-url. The YAML file is named by
// --config (or RELAY_CONFIG); an unknown key in it is an error, so typos are
// caught at start.
//
// Values: sizes accept a plain byte count or a number with a decimal (KB, MB,
// GB, TB) or binary (KiB, MiB, GiB, TiB) unit ("8GiB", "20MB", "1000000");
// durations accept Go durations plus a leading day count ("6d", "1d12h").
//
// Secrets: Load reads the admin token (--admin-token, or --admin-token-file
// through admintoken.Load, which warns via Config.Warnings when the file is
// readable by group or others) into Config.Token and drops the raw value, and
// loads --credentials with credentials.Load into Config.Creds. Validate is the
// one place that refuses a credentials file without an admin token, and an
// --admin-listen that is not loopback (LoopbackAddr) without one unless
// --admin-insecure-open. No error of Load holds a token or a credential value.
//
// Sources: Config.Settings lists every option with the value as given
// (secrets and URL passwords masked) and its Origin (default, flag,
// variable, or file and line); Config.Source names it for a person. A
// validation error names the source of the bad value ("max-batch-events
// 3000 is above 1999: ... (from variable RELAY_MAX_BATCH_EVENTS)"), never a
// flag that was not given; Validate alone returns a *SettingError.
//
// Reloads: each option of the table says whether a reload puts it in
// force, and between which values (Live, LiveFrom); Reloaded is the
// configuration in force after one, every other setting kept.
//
// Only cmd/relay uses this package. A component's Config that a reload
// changes in part, or that two callers make, is made by one method of
// Config (DeliveryLive, Ingest, Plan, ...: components.go), so a setting
// reaches it by one path; what is no setting (a hook, a TLS configuration,
// a shared reference) the caller adds. Load has no
// side effects beyond reading the files it names.
package config
