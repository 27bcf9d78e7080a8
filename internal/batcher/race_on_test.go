//go:build race

package batcher

// raceEnabled scales the heaviest tests down under the race detector.
const raceEnabled = true
