package event

import "encoding/binary"

// The top-level event fields of the ingestion document's Event table that
// have a type the relay checks, by their index in fieldNames. Unknown fields
// are allowed and not looked at. Parse records the values of the first ones,
// up to lastRecorded; of the others only the type matters.
const (
	fUserID = iota
	fDeviceID
	fEventType
	fTime
	fInsertID
	fIP

	lastRecorded = fIP

	// fEventProps and fUserProps are not recorded, but where their keys
	// are is (Event.PlanKeys).
	fEventProps = lastRecorded + 1
	fUserProps  = lastRecorded + 2
)

// fieldNames are the fields' names, as the error body uses them.
var fieldNames = [...]string{"user_id", "device_id", "event_type", "time", "insert_id", "ip",
	"event_properties", "user_properties", "group_properties", "groups", "plan", "session_id", "event_id",
	"quantity", "price", "revenue", "location_lat", "location_lng", "$skip_user_properties_sync",
	"user_agent", "app_version", "platform", "os_name", "os_version", "device_brand", "device_manufacturer",
	"device_model", "carrier", "country", "region", "city", "dma", "language", "productId", "revenueType",
	"currency", "idfa", "idfv", "android_app_set_id", "adid", "android_id"}

const numFields = len(fieldNames)

// Value kinds of the Event table.
const (
	kString   = iota // string
	kInt             // integer (JSON number without fraction or exponent, in int64)
	kNumber          // float: any JSON number
	kObject          // object
	kPropTree        // object whose nesting is at most maxPropDepth
	kBool            // boolean
)

// maxPropDepth is the Limits table's "Object depth: event_properties,
// user_properties: 40 layers". The property object itself is layer 1; every
// object or array nested in it adds a layer.
const maxPropDepth = 40

// fieldKinds are the types of the Event table, by field.
var fieldKinds = func() (k [numFields]uint8) {
	for name, kind := range map[string]uint8{
		"time": kInt, "session_id": kInt, "event_id": kInt, "quantity": kInt,
		"event_properties": kPropTree, "user_properties": kPropTree,
		// not depth limited: the Limits table names only the two above
		"group_properties": kObject, "groups": kObject, "plan": kObject,
		"price": kNumber, "revenue": kNumber, "location_lat": kNumber, "location_lng": kNumber,
		"$skip_user_properties_sync": kBool,
	} { // every other field is kString (0)
		k[lookupField([]byte(name))] = kind
	}
	return k
}()

// lookupField returns the field named by key (unescaped), or -1: for the
// keys byWords does not match (escaped, longer than shortFieldLen).
func lookupField(key []byte) int {
	if f, ok := byName[string(key)]; ok {
		return f
	}
	return -1
}

var byName = func() map[string]int {
	m := make(map[string]int, numFields)
	for f, name := range fieldNames {
		m[name] = f
	}
	return m
}()

// maxFieldLen is the longest field name; an escaped key whose value would be
// longer names no field.
const maxFieldLen = len("$skip_user_properties_sync")

// Event keys are matched by their bytes as two little-endian words (see
// eventKey): a field name of at most 16 bytes, zero-padded, is one pair of
// words, and byWords maps a hash of the pair to the field.

// shortFieldLen is the longest name byWords holds.
const shortFieldLen = 16

// nameWords returns the first 16 bytes of name, zero-padded, as two
// little-endian words.
func nameWords(name string) (lo, hi uint64) {
	var w [16]byte
	copy(w[:], name)
	return binary.LittleEndian.Uint64(w[:8]), binary.LittleEndian.Uint64(w[8:])
}

// KeyMasks[n] keep the first n bytes of two little-endian words.
var KeyMasks = func() (m [shortFieldLen + 1][2]uint64) {
	for n := range m {
		for k := range n {
			m[n][k/8] |= 0xff << (8 * (k % 8))
		}
	}
	return m
}()

// byWords is the perfect hash table of the field names of at most
// shortFieldLen bytes, by their words.
var byWords = newWordTable()

type wordTable struct {
	mul  uint64 // the multiplier of hash: the first that gives no collisions
	slot [128]wordSlot
}

// wordSlot is a field name's words and the field (-1 in an empty slot).
type wordSlot struct {
	lo, hi uint64
	f      int
}

// hash maps a key's words to a slot (multiplicative hashing: the top 7
// bits of the product).
func (t *wordTable) hash(lo, hi uint64) uint {
	return uint(((lo ^ hi) * t.mul) >> (64 - 7))
}

// lookup returns the field whose name has the words lo, hi, or -1.
func (t *wordTable) lookup(lo, hi uint64) int {
	if s := &t.slot[t.hash(lo, hi)]; s.lo == lo && s.hi == hi {
		return s.f
	}
	return -1
}

// newWordTable builds byWords from fieldNames.
func newWordTable() *wordTable {
	t := &wordTable{}
	// Try odd multipliers (a Weyl sequence) until the names fit without
	// collisions; one of the first few hundred does.
	for k := uint64(1); k < 1<<20; k++ {
		t.mul = k*0x9E3779B97F4A7C15 | 1
		for h := range t.slot {
			t.slot[h] = wordSlot{f: -1}
		}
		ok := true
		for f, name := range fieldNames {
			if len(name) > shortFieldLen {
				continue
			}
			lo, hi := nameWords(name)
			s := &t.slot[t.hash(lo, hi)]
			if s.f >= 0 {
				ok = false
				break
			}
			*s = wordSlot{lo, hi, f}
		}
		if ok {
			return t
		}
	}
	panic("event: no multiplier hashes the field names without collisions")
}
