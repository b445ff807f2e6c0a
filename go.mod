module github.com/stockade-sh/stockade

go 1.26
