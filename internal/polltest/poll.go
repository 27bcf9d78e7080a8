// Package poll waits, in tests, for a condition that real I/O (sockets,
// files, another process) makes true at a time the test cannot know. It is
// imported by tests only.
//
// Where the code under test uses only timers and channels, a test runs in
// a testing/synctest bubble instead and needs no polling. Where it cannot
// (a real socket, a bbolt file, a child process), it polls with a bound
// generous enough for a loaded 2-core CI machine: the bound costs nothing
// when the condition comes true, and only decides how long a failing test
// takes to say so.
package polltest

import (
	"testing"
	"time"
)

// Max is the bound of Until: long enough that a loaded machine running the
// race detector never reaches it where a quiet one takes milliseconds.
const Max = 2 * time.Minute

// interval is the time between two looks at the condition.
const interval = 10 * time.Millisecond

// Until calls cond until it returns true, and fails t (naming what it
// waited for) if Max passes first.
func Until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	Within(t, Max, what, cond)
}

// Within is Until with the bound d: for a condition whose wrong outcome is
// a wait of about d or more, where the test needs a shorter bound than Max
// to tell the two apart.
func Within(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(interval)
	}
}
