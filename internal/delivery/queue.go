package delivery

import "time"

// queue is a FIFO of items with push-front, tracking its data bytes.
type queue struct {
	buf   []item
	head  int
	bytes int
}

func (q *queue) len() int     { return len(q.buf) - q.head }
func (q *queue) peek() *item  { return &q.buf[q.head] }
func (q *queue) push(it item) { q.buf = append(q.buf, it); q.bytes += len(it.rec.Data) }

func (q *queue) pop() item {
	it := q.buf[q.head]
	q.buf[q.head] = item{}
	q.head++
	q.bytes -= len(it.rec.Data)
	if q.head == len(q.buf) {
		q.buf, q.head = q.buf[:0], 0
	} else if q.head >= 1024 && q.head*2 >= len(q.buf) {
		n := copy(q.buf, q.buf[q.head:])
		clear(q.buf[n:])
		q.buf, q.head = q.buf[:n], 0
	}
	return it
}

// pushFront puts its, in order, before everything queued.
func (q *queue) pushFront(its []item) {
	if len(its) == 0 {
		return
	}
	for i := range its {
		q.bytes += len(its[i].rec.Data)
	}
	if q.head >= len(its) {
		q.head -= len(its)
		copy(q.buf[q.head:], its)
		return
	}
	nb := make([]item, 0, len(its)+q.len()+16)
	nb = append(nb, its...)
	nb = append(nb, q.buf[q.head:]...)
	q.buf, q.head = nb, 0
}

// held is the queue of one OrderKey whose events wait (paused or paced).
type held struct {
	key   string
	until time.Time
	items []item
}

// heldHeap orders held queues by until.
type heldHeap []*held

func (h heldHeap) Len() int           { return len(h) }
func (h heldHeap) Less(i, j int) bool { return h[i].until.Before(h[j].until) }
func (h heldHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *heldHeap) Push(x any)        { *h = append(*h, x.(*held)) }
func (h *heldHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}
