from vtakit.cli import main

main()
