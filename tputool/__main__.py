from tputool.cli import main

main()
