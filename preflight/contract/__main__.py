from preflight.contract import main

main()
