package event

// Error is a rejection in the upstream's own form: the HTTP status and the
// JSON body fields of the ingestion document's Errors section.
type Error struct {
	Status int    // HTTP status, also the body's "code"
	Msg    string // the body's "error", e.g. "Invalid field values on some events"
	// MissingField names the missing request-level field ("api_key", "events").
	MissingField string
	// InvalidFields and MissingFields map a field name to the index of the
	// first event with that error (a one-element slice, as the upstream sends).
	InvalidFields map[string][]int
	MissingFields map[string][]int
}

func (e *Error) Error() string { return e.Msg }

// AppendJSON appends the upstream's JSON body for e to dst.
func (e *Error) AppendJSON(dst []byte) []byte { panic("unimplemented") }
