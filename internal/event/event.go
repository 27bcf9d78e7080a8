package event

// Request is one parsed ingest envelope. Reuse it across calls to Parse.
type Request struct {
	// APIKey is the envelope's api_key, unescaped.
	APIKey []byte
	// Options is the raw bytes of the envelope's "options" object exactly as
	// sent, or nil when absent. Two requests with equal Options share a lane.
	Options []byte
	// MinIDLength is options.min_id_length, or DefaultMinIDLength.
	MinIDLength int
	// Events holds one entry per element of "events", in order.
	Events []Event
}

// DefaultMinIDLength is the upstream's minimum user_id/device_id length.
const DefaultMinIDLength = 5

// Event is one event object of a Request. Its slices alias the request body.
type Event struct {
	// Raw is the event object's bytes, from '{' to '}' inclusive.
	Raw []byte
	// DeviceID and UserID are the unescaped ids, nil when absent or shorter
	// than the request's MinIDLength (the upstream removes such ids).
	DeviceID, UserID []byte
	// HasInsertID and HasTime report whether insert_id / time are present.
	HasInsertID, HasTime bool
	// (unexported fields record spans needed by AppendRewritten)
}

// OrderKey returns the key under which the upstream orders and rate limits
// this event: the device id, else the user id (prefixed so the two spaces
// cannot collide). Events with the same OrderKey must be delivered in order.
func (e *Event) OrderKey(dst []byte) []byte { panic("unimplemented") }

// Parse parses and validates body into req (which is reset first). A nil
// *Error means every event is acceptable to the upstream.
func Parse(body []byte, req *Request) *Error { panic("unimplemented") }

// AppendRewritten appends the event as the relay spools it: insert_id is
// added when absent (taken from ids), time is added as nowMS when absent, and
// an ip of "$remote" is replaced by remoteIP. All other bytes are copied
// unchanged.
func (e *Event) AppendRewritten(dst []byte, ids *IDGen, nowMS int64, remoteIP []byte) []byte {
	panic("unimplemented")
}

// IDGen generates insert_ids that are unique across processes and restarts
// (a random per-generator prefix plus a counter). Safe for concurrent use.
type IDGen struct{}

// NewIDGen returns a generator with a fresh random prefix.
func NewIDGen() *IDGen { panic("unimplemented") }

// Append appends a new unique insert_id (no quotes) to dst.
func (g *IDGen) Append(dst []byte) []byte { panic("unimplemented") }
