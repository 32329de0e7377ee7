from railhop.cli import main

main()
