from preflight.contract import main

if __name__ == "__main__":
    main()
