from croqq.cli import main

main()
