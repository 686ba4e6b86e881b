module example.invalid/zygote/clients/go

go 1.22
