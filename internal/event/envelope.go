package event

import "encoding/json"

// EnvelopeOverhead is the number of bytes an upstream request body takes
// besides its events and the commas between them: {"api_key":K,"events":[
// ... ],"options":O} (no options part when options is empty), exactly as
// the batcher writes it (the api_key marshalled by encoding/json). An event
// of n bytes fits alone in a request under maxBytes only when
// EnvelopeOverhead + n < maxBytes.
func EnvelopeOverhead(apiKey string, options []byte) int {
	q, _ := json.Marshal(apiKey) // a string always marshals
	n := len(`{"api_key":`) + len(q) + len(`,"events":[`) + len(`]`) + len(`}`)
	if len(options) > 0 {
		n += len(`,"options":`) + len(options)
	}
	return n
}
