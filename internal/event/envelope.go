package event

import "encoding/json"

// EnvelopeOverhead is the number of bytes an upstream request body takes
// besides its events and the commas between them: {"api_key":K,"events":[
// ... ],"options":O} (no options part when options is empty), exactly as
// the lane runner writes it (the api_key marshalled by encoding/json). An event
// of n bytes fits alone in a request under maxBytes only when
// EnvelopeOverhead + n < maxBytes.
func EnvelopeOverhead(apiKey string, options []byte) int {
	q, _ := json.Marshal(apiKey) // a string always marshals
	return envelopeFixed(options) + len(q)
}

// MaxEnvelopeOverhead bounds EnvelopeOverhead from above for an api_key of
// apiKeyLen bytes, without marshalling it: encoding/json writes no byte of
// a string as more than 6 (`\u00XX`, and `\ufffd` for an invalid byte),
// plus the quotes. An event that fits with it fits with the exact figure.
func MaxEnvelopeOverhead(apiKeyLen int, options []byte) int {
	return envelopeFixed(options) + 6*apiKeyLen + 2
}

// envelopeFixed is the envelope's bytes besides the quoted api_key.
func envelopeFixed(options []byte) int {
	n := len(`{"api_key":`) + len(`,"events":[`) + len(`]`) + len(`}`)
	if len(options) > 0 {
		n += len(`,"options":`) + len(options)
	}
	return n
}
