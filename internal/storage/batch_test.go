package storage

import "testing"

func TestBufClass(t *testing.T) {
	for _, tt := range []struct{ n, class, size int }{
		{0, 0, 512}, {1, 0, 512}, {512, 0, 512}, {513, 1, 640}, {640, 1, 640}, {641, 2, 768}, {1024, 4, 1024},
		{1025, 5, 1280}, {4096, 12, 4096}, {4097, 13, 5120}, {513 << 10, 41, 640 << 10}, {1 << 20, 44, 1 << 20},
		{16 << 20, numClasses - 1, 16 << 20}, {16<<20 + 1, -1, 0},
	} {
		if got := bufClass(tt.n); got != tt.class {
			t.Errorf("bufClass(%d) = %d, want %d", tt.n, got, tt.class)
		}
		if tt.class >= 0 && classSize(tt.class) != tt.size {
			t.Errorf("classSize(%d) = %d, want %d", tt.class, classSize(tt.class), tt.size)
		}
	}
	// Every size has the smallest class that holds it, wasting at most a
	// fifth of it.
	for n := 1; n <= 16<<20; n += 1 + n/7 {
		c := bufClass(n)
		if size := classSize(c); size < n || (c > 0 && classSize(c-1) >= n) || (n > 512 && size-n > size/5) {
			t.Fatalf("bufClass(%d) = %d of %d bytes", n, c, size)
		}
	}
}

// A batch that grows past its buffer moves to a larger class.
func TestBatchGrowsByClass(t *testing.T) {
	var g Batch
	big := Record{OrderKey: []byte("k"), Data: make([]byte, 700)}
	for range 50 {
		g.Add(big)
	}
	if n := cap(g.cb.B); classSize(bufClass(n)) != n {
		t.Fatalf("grown batch buffer of %d bytes is not a size class", n)
	}
}
