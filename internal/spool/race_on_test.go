//go:build race

package spool

// raceEnabled scales the heaviest tests down under the race detector, which
// makes bbolt's page copies about five times slower.
const raceEnabled = true
