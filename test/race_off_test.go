//go:build !race

package test

// raceDetector: this test binary was built with -race.
const raceDetector = false
