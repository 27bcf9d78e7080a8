package event

import (
	"regexp"
	"sync"
	"testing"
)

func TestIDGenFormat(t *testing.T) {
	g := NewIDGen()
	re := regexp.MustCompile(`^[0-9a-f]{16}[1-9a-f][0-9a-f]{0,15}$`)
	for i := range 20 {
		id := string(g.Append(nil))
		if !re.MatchString(id) {
			t.Fatalf("id %d = %q", i, id)
		}
	}
	g.n.Store(1<<64 - 2)
	if id := string(g.Append([]byte("x"))); id != "x"+string(g.prefix[:])+"ffffffffffffffff" {
		t.Errorf("largest counter: %q", id)
	}
	if string(NewIDGen().prefix[:]) == string(g.prefix[:]) {
		t.Error("two generators share a prefix")
	}
}

func TestIDGenUniqueConcurrent(t *testing.T) {
	gens := []*IDGen{NewIDGen(), NewIDGen()}
	const workers, per = 4, 5000
	out := make([][]string, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			g := gens[w%len(gens)]
			var buf []byte
			for range per {
				buf = g.Append(buf[:0])
				out[w] = append(out[w], string(buf))
			}
		})
	}
	wg.Wait()
	seen := make(map[string]bool, workers*per)
	for _, ids := range out {
		for _, id := range ids {
			if seen[id] {
				t.Fatalf("duplicate id %q", id)
			}
			seen[id] = true
		}
	}
}

func TestIDGenZeroValuePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("zero IDGen did not panic")
		}
	}()
	var g IDGen
	g.Append(nil)
}
