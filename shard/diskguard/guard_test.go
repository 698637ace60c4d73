package diskguard

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// smallDisk mounts an 8 MiB tmpfs for the test, or skips it.
func smallDisk(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("needs a small file system: mounting a tmpfs is not permitted here (%v: %s); run as root", err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() { exec.Command("umount", dir).Run() })
	return dir
}

func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			return
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not after 5s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestGuardFullAndBack: on an 8 MiB file system with a 1 MiB reserve and a
// 2 MiB minimum, filling the disk makes Check answer ErrDiskFull naming the
// node; Admit refuses what would not fit; Release deletes the reserve and
// its space can be written; freeing the space makes Check answer nil again
// and writes the reserve back.
func TestGuardFullAndBack(t *testing.T) {
	dir := smallDisk(t)
	g, err := New(Config{Dir: dir, NodeID: "n7", MinFree: 2 << 20, Reserve: 1 << 20, Interval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	reserve := filepath.Join(dir, ReserveFile)
	if info, err := os.Stat(reserve); err != nil || info.Size() != 1<<20 {
		t.Fatalf("reserve file: %v, %v", info, err)
	}
	if err := g.Check(); err != nil {
		t.Fatalf("an empty disk: %v", err)
	}
	if err := g.Admit(1 << 20); err != nil {
		t.Fatalf("admitting 1 MiB on an empty 8 MiB disk: %v", err)
	}
	if err := g.Admit(7 << 20); !errors.Is(err, ErrDiskFull) {
		t.Fatalf("admitting 7 MiB: %v, want ErrDiskFull", err)
	}
	filler := filepath.Join(dir, "filler")
	fill(t, filler)
	waitFor(t, "full", func() bool { return g.Check() != nil })
	if err := g.Check(); !errors.Is(err, ErrDiskFull) || !strings.Contains(err.Error(), "disk full on n7") {
		t.Fatalf("Check on a full disk: %v", err)
	}
	if g.State().ReserveReleased {
		t.Fatal("the reserve was released before anyone asked")
	}
	if !g.Release("test") || g.Release("test again") {
		t.Fatal("Release does not release the reserve once")
	}
	if _, err := os.Stat(reserve); !os.IsNotExist(err) {
		t.Fatalf("reserve file still there after its release: %v", err)
	}
	// The released space is there for the write that needed it.
	if err := os.WriteFile(filepath.Join(dir, "term"), make([]byte, 512<<10), 0o600); err != nil {
		t.Fatalf("writing into the released reserve: %v", err)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "space back", func() bool { return g.Check() == nil })
	waitFor(t, "reserve restored", func() bool { return !g.State().ReserveReleased })
	if info, err := os.Stat(reserve); err != nil || info.Size() != 1<<20 {
		t.Fatalf("reserve file after space returned: %v, %v", info, err)
	}
}
