module coroner.dev/go-worker

go 1.22
