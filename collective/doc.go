// Package collective will own allreduce (ring, and recursive
// halving-doubling for small buffers), broadcast and barrier among trainer
// processes over TCP. It stands alone: it imports no other raftps package.
// Not built yet: see the issue "Trainers" and ../shared/DESIGN.md.
package collective
