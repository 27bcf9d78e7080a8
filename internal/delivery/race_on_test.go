//go:build race

package delivery

// raceEnabled scales the heaviest tests down under the race detector.
const raceEnabled = true
