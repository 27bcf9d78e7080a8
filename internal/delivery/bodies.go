package delivery

// bodyPool keeps up to bodyPoolSize request body buffers. Unlike a
// sync.Pool it is not emptied by GC cycles, which under load come several
// times a second (a fresh body is up to MaxBatchBytes, zeroed).
type bodyPool struct{ free chan []byte }

// bodyPoolSize bounds what waiting shards keep: ~8 MB at the default
// MaxBatchBytes, whatever the number of lanes.
const bodyPoolSize = 8

func newBodyPool() bodyPool { return bodyPool{free: make(chan []byte, bodyPoolSize)} }

// get returns an empty buffer with room for a body of up to max bytes.
func (p bodyPool) get(max int) []byte {
	select {
	case b := <-p.free:
		if cap(b) >= max {
			return b[:0]
		}
	default:
	}
	return make([]byte, 0, max)
}

// put keeps b for a later get, or drops it when the pool is full.
func (p bodyPool) put(b []byte) {
	select {
	case p.free <- b[:0]:
	default:
	}
}

// drain drops every kept buffer.
func (p bodyPool) drain() {
	for {
		select {
		case <-p.free:
		default:
			return
		}
	}
}
