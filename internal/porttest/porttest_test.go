package porttest

import "testing"

// TestBelowEphemeralRange: the ports are ones no outgoing connection can be
// given between Free and the server's bind, and distinct.
func TestBelowEphemeralRange(t *testing.T) {
	high := ephemeralLow()
	if high <= low+1000 {
		t.Skipf("ephemeral range starts at %d", high)
	}
	ports, err := Free(30)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p < low || p >= high || seen[p] {
			t.Fatalf("port %d: want distinct ports in [%d, %d)", p, low, high)
		}
		seen[p] = true
	}
}
