package zygote

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// moduleUse matches the module path where Go code and the docs name it: an
// import string ("host/.../clients/go" or a package below it) and the
// arguments of `go mod edit -require M@v -replace M=dir` or `go get M@v`.
var moduleUse = regexp.MustCompile(`"([a-z0-9.-]+\.[a-z]+/[^"\s]*clients/go)(?:/[^"\s]*)?"|\b([a-z0-9.-]+\.[a-z]+/\S*clients/go)[@=]`)

// go.mod is where the module path is set; every import and install line
// in the repository follows it, so a new path (a hosted repository) is
// one edit of go.mod plus the rewrite CONTRIBUTING.md gives, which this
// test checks is complete.
func TestModulePathMatchesGoMod(t *testing.T) {
	goMod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	module := ""
	for _, line := range strings.Split(string(goMod), "\n") {
		if rest, ok := strings.CutPrefix(line, "module "); ok {
			module = strings.TrimSpace(rest)
		}
	}
	if module == "" {
		t.Fatal("go.mod declares no module")
	}
	root := filepath.Join("..", "..")
	uses := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "target", "dist", "node_modules":
				return filepath.SkipDir
			}
			return nil
		}
		if ext := filepath.Ext(path); ext != ".go" && ext != ".md" {
			return nil
		}
		file, err := os.Open(path)
		if err != nil {
			return err
		}
		defer file.Close()
		lines := bufio.NewScanner(file)
		lines.Buffer(nil, 1<<20)
		for n := 1; lines.Scan(); n++ {
			for _, match := range moduleUse.FindAllStringSubmatch(lines.Text(), -1) {
				used := match[1] + match[2]
				uses++
				if used != module {
					t.Errorf("%s:%d names module %s; go.mod says %s", path, n, used, module)
				}
			}
		}
		return lines.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	// The README, this module's README, the examples and the benchmark
	// command import it at least.
	if uses < 5 {
		t.Errorf("found the module path %d times; expected the imports in the docs and cmd/", uses)
	}
}
